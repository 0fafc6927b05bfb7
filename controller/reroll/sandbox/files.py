"""File operations every backend shares, built on the sidecar client: upload a folder, hash a tree."""

from __future__ import annotations

import json
from pathlib import Path

from reroll.errors import SandboxError
from reroll.sandbox.sidecar_client import SidecarClient

# Runs inside the sandbox (any Python 3): prints {relative path: sha256 or "symlink:<target>"}.
# Bytecode caches are left out: they embed the source's mtime, so a faithful replay differs there.
_MANIFEST_SCRIPT = r"""
import hashlib, json, os, sys
root = sys.argv[1]
out = {}
for base, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(files):
        if name.endswith((".pyc", ".pyo")):
            continue
        full = os.path.join(base, name)
        rel = os.path.relpath(full, root)
        if os.path.islink(full):
            out[rel] = "symlink:" + os.readlink(full)
            continue
        digest = hashlib.sha256()
        with open(full, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[rel] = digest.hexdigest()
json.dump(out, sys.stdout, sort_keys=True)
"""


async def upload_dir(client: SidecarClient, source: Path, destination: str) -> int:
    """Copy every file under host folder `source` to `destination` in the sandbox, keeping modes.

    Returns:
        The number of files copied.
    """
    count = 0
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        target = f"{destination.rstrip('/')}/{file.relative_to(source).as_posix()}"
        await client.put_file(target, file.read_bytes(), mode=file.stat().st_mode & 0o777)
        count += 1
    return count


async def workspace_manifest(client: SidecarClient, root: str, env: dict[str, str]) -> dict[str, str]:
    """Hash every file under `root` in the sandbox.

    Returns:
        ``{relative path: sha256 hex}`` (symlinks as ``"symlink:<target>"``), sorted by path;
        bytecode caches (``__pycache__/``, ``*.pyc``) are left out.

    Raises:
        SandboxError: the sandbox has no working ``python3`` or the walk failed.
    """
    result = await client.exec(
        ["python3", "-I", "-c", _MANIFEST_SCRIPT, root], env=env, inherit_env=False, timeout_seconds=300
    )
    if result.exit_code != 0:
        raise SandboxError(f"hashing the workspace {root} failed: {result.output_text()[-2000:]}")
    manifest: dict[str, str] = json.loads(result.stdout)
    return manifest
