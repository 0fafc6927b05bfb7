"""The workspace manifest: a sha256 of every regular file of a tree the agent wrote.

Runs in the sidecar (root in a container) on a hostile tree: every entry is looked at with
``lstat`` and opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked again with ``fstat``, so no
symlink is followed, no FIFO blocks and a file swapped while hashed is reported, not read.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

_BLOCK_BYTES = 1 << 20


def _entry(full: str) -> str:
    """The manifest value of the path `full` (see `tree_manifest`). Raises OSError."""
    info = os.lstat(full)
    if stat.S_ISLNK(info.st_mode):
        return "symlink:" + os.readlink(full)
    if stat.S_ISFIFO(info.st_mode):
        return "fifo:"
    if stat.S_ISSOCK(info.st_mode):
        return "socket:"
    if not stat.S_ISREG(info.st_mode):
        return "device:"
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "unreadable:replaced while hashed"
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _mount_points() -> set[str]:
    """The mount points of this process's mount namespace (``/proc/self/mountinfo``'s fifth
    field, octal escapes decoded); empty where it cannot be read."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def tree_manifest(root: str) -> dict[str, str]:
    """Hash the tree at the absolute folder `root`.

    Returns:
        ``{relative path: value}`` sorted by path, the value being the sha256 hex of a regular
        file, ``"symlink:<target>"`` for a symlink (to a file or a folder: never descended),
        ``"fifo:"``, ``"socket:"`` or ``"device:"`` (never opened), or ``"unreadable:<why>"``.
        Bytecode caches (``__pycache__/``, ``*.pyc``, ``*.pyo``) are left out: they embed the
        source's mtime, so a faithful replay differs there. So are the mount points below `root`
        and what they hold (the read-only agents folder under a ``/root`` workspace, say): what
        is bound in is not what the agent wrote.

    Raises:
        NotADirectoryError: `root` is not a folder (or is a symlink).
    """
    if not stat.S_ISDIR(os.lstat(root).st_mode):
        raise NotADirectoryError(f"{root} is not a folder")
    out: dict[str, str] = {}
    mounts = _mount_points()
    for base, dirs, files in os.walk(root):
        dirs.sort()
        dirs[:] = [d for d in dirs if os.path.join(base, d) not in mounts]
        for name in [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            dirs.remove(name)
            files.append(name)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(base, name)
            try:
                out[os.path.relpath(full, root)] = _entry(full)
            except OSError as exc:
                out[os.path.relpath(full, root)] = "unreadable:" + (exc.strerror or str(exc))
    return dict(sorted(out.items()))
