"""File operations for root on trees the agent can write, that never follow the agent's symlinks.

Every path here has a *trusted* part, a folder the sidecar was told about (the workspace, the
agent's HOME, a site directory: opened as the kernel resolves it), and the rest, which lies in
the agent's tree: that rest is opened component by component (``openat`` with ``O_NOFOLLOW``),
so a folder the agent replaced by a symlink (``workspace/tests`` → the verifier's folder,
``workspace/x`` → ``/etc``) is never passed through. Such a symlink, or a non-folder where a
folder should be, is *replaced* by an empty folder (`secure_parent` with ``replace=True``, what
a restore wants: the folder then belongs to the sidecar's user, root in a container) or refused
(`UnsafePath`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_DIR_MODE = 0o755


class UnsafePath(OSError):
    """A path leads through a symlink the agent may have made, or through a non-folder."""


def _components(path: str) -> list[str]:
    if not os.path.isabs(path):
        raise UnsafePath(f"{path!r} is not an absolute path")
    return [part for part in os.path.normpath(path).split("/") if part]


def _open_child_dir(parent: int, name: str, where: str, replace: bool, notes: list[str]) -> int:
    """Open folder `name` in `parent` without following an untrusted symlink (see the module docstring)."""
    try:
        info = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        if not replace:
            raise
        os.mkdir(name, NEW_DIR_MODE, dir_fd=parent)
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    if stat.S_ISDIR(info.st_mode):
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    what = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a folder"
    if not replace:
        raise UnsafePath(f"{where} is {what} (owner uid {info.st_uid}); not followed")
    os.unlink(name, dir_fd=parent)
    os.mkdir(name, NEW_DIR_MODE, dir_fd=parent)
    notes.append(f"{where} was {what} (owner uid {info.st_uid}): replaced by an empty folder")
    return os.open(name, DIR_FLAGS, dir_fd=parent)


@contextlib.contextmanager
def secure_parent(
    path: str, trusted: str, *, replace: bool = False, notes: list[str] | None = None
) -> Iterator[tuple[int, str]]:
    """Open the folder holding `path` without following a symlink below `trusted`.

    Args:
        path: an absolute path.
        trusted: the folder (`path`'s or one above) opened as the kernel resolves it; below it
            no symlink is followed.
        replace: replace an untrusted symlink or a non-folder on the way (and create missing
            folders) instead of raising.
        notes: where a line is appended for each replacement.

    Yields:
        ``(folder descriptor, last component of path)``, for ``*at`` calls (``dir_fd=``).

    Raises:
        UnsafePath: a component below `trusted` is a symlink or not a folder (without
            `replace`), `path` is relative or ``/``, or `trusted` is not above it.
        FileNotFoundError: `trusted` or a folder below it is missing (without `replace`).
    """
    parts, top = _components(path), _components(trusted)
    if not parts or parts[: len(top)] != top or len(top) >= len(parts):
        raise UnsafePath(f"{path!r} is not below the folder {trusted!r}")
    fd = os.open("/" + "/".join(top), DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        where = "/" + "/".join(top)
        for part in parts[len(top) : -1]:
            where = os.path.join(where, part)
            child = _open_child_dir(fd, part, where, replace, notes if notes is not None else [])
            os.close(fd)
            fd = child
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _at(path: str, trusted: str, action: Callable[[str, int], object]) -> bool:
    """Run ``action(name, folder descriptor)`` on `path` reached as `secure_parent` does; False
    when it is not there or a folder on the way is a symlink or not a folder."""
    try:
        with secure_parent(path, trusted) as (folder, name):
            action(name, folder)
    except (UnsafePath, FileNotFoundError, NotADirectoryError):
        return False
    return True


def lexists(path: str, trusted: str) -> bool:
    """Whether `path` exists (a symlink counts, not followed), its folders below `trusted` reached
    without following symlinks; False when one of them is a symlink."""
    return _at(path, trusted, lambda name, folder: os.lstat(name, dir_fd=folder))


def unlink(path: str, trusted: str) -> bool:
    """Delete the file or symlink `path` (never what a symlink points to); its folders below
    `trusted` reached without following symlinks.

    Returns:
        False when it was not there, or a folder on the way is the agent's symlink (the file it
        named is then not at `path`).
    """
    return _at(path, trusted, lambda name, folder: os.unlink(name, dir_fd=folder))


def chown_root(path: str, trusted: str) -> bool:
    """Give `path` (a symlink itself, not its target) to root:root, its folders below `trusted`
    reached without following symlinks; False when it is not there."""
    return _at(path, trusted, lambda name, folder: os.chown(name, 0, 0, dir_fd=folder, follow_symlinks=False))


def hand_tree_to_root(top: str) -> int:
    """Give `top` and everything below it to root:root (symlinks themselves, never followed) and
    take group and others' write permission off folders and regular files, so that no other user
    can change the tree afterwards. The caller makes sure nothing else writes to it meanwhile
    (the agent's processes are frozen): a folder is walked through descriptors (``os.fwalk``)
    either way, never through a symlink.

    Returns:
        How many entries were handed over (`top` included).

    Raises:
        OSError: `top` cannot be opened, or an entry cannot be changed.
    """
    handed = 0

    def hand(name: str, folder: int) -> None:
        nonlocal handed
        info = os.lstat(name, dir_fd=folder)
        os.chown(name, 0, 0, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode):
            os.chmod(name, stat.S_IMODE(info.st_mode) & ~0o022, dir_fd=folder)
        handed += 1

    parent, name = os.path.split(os.path.normpath(top))
    parent_fd = os.open(parent or "/", DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        hand(name, parent_fd)
    finally:
        os.close(parent_fd)
    for _, folders, files, folder in os.fwalk(top, follow_symlinks=False):
        for entry in (*folders, *files):
            hand(entry, folder)
    return handed
