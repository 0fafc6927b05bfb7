"""Hash a tree in any sandbox, through `Sandbox.exec` (the workspace manifest of a run folder)."""

from __future__ import annotations

import json

from reroll.errors import SandboxError, VerifierError
from reroll.sandbox.base import Sandbox

MANIFEST_TIMEOUT_SECONDS = 300.0
"""The longest the hashing may take; the agent controls the tree, so running out is a verifier error."""

# Runs inside the sandbox (any Python 3), as root in a container, on a tree the agent wrote: every
# entry is looked at with lstat and opened with O_NOFOLLOW | O_NONBLOCK, so no symlink is followed
# and no FIFO blocks. Prints {relative path: sha256, "symlink:<target>", or "<kind>:" for what is
# not hashed (fifo, socket, device, unreadable)}. Bytecode caches are left out: they embed the
# source's mtime, so a faithful replay differs there.
_MANIFEST_SCRIPT = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
out = {}
def entry(full):
    info = os.lstat(full)
    if stat.S_ISLNK(info.st_mode):
        return "symlink:" + os.readlink(full)
    if not stat.S_ISREG(info.st_mode):
        if stat.S_ISFIFO(info.st_mode):
            return "fifo:"
        return "socket:" if stat.S_ISSOCK(info.st_mode) else "device:"
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "unreadable:replaced while hashed"
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
for base, dirs, files in os.walk(root):
    dirs.sort()
    for name in [d for d in dirs if os.path.islink(os.path.join(base, d))]:
        dirs.remove(name)
        files.append(name)
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in sorted(files):
        if name.endswith((".pyc", ".pyo")):
            continue
        full = os.path.join(base, name)
        try:
            out[os.path.relpath(full, root)] = entry(full)
        except OSError as exc:
            out[os.path.relpath(full, root)] = "unreadable:" + (exc.strerror or str(exc))
json.dump(out, sys.stdout, sort_keys=True)
"""


async def workspace_manifest(sandbox: Sandbox, root: str, env: dict[str, str]) -> dict[str, str]:
    """Hash every regular file under `root` in `sandbox`, following no symlink, opening nothing else.

    Returns:
        ``{relative path: sha256 hex}``, sorted by path; a symlink (to a file or a folder) as
        ``"symlink:<target>"``, a FIFO, socket or device as ``"fifo:"``, ``"socket:"``,
        ``"device:"`` (never opened), a file that cannot be read as ``"unreadable:<why>"``;
        bytecode caches (``__pycache__/``, ``*.pyc``) are left out.

    Raises:
        VerifierError: the hashing took longer than `MANIFEST_TIMEOUT_SECONDS`.
        SandboxError: the sandbox has no working ``python3`` or the walk failed.
    """
    result = await sandbox.exec(
        ["python3", "-I", "-c", _MANIFEST_SCRIPT, root],
        env=env,
        inherit_env=False,
        timeout_seconds=MANIFEST_TIMEOUT_SECONDS,
    )
    if result.timed_out:
        raise VerifierError(f"hashing the workspace {root} took longer than {MANIFEST_TIMEOUT_SECONDS:.0f} s")
    if result.exit_code != 0:
        raise SandboxError(f"hashing the workspace {root} failed: {result.output_text()[-2000:]}")
    manifest: dict[str, str] = json.loads(result.stdout)
    return manifest
