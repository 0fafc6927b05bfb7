"""The container's own writable layer (what the agent writes outside the sized folders: apt
installs, ``/etc``, ``/usr/local``…), copied at a step and given to children.

``docker commit`` would carry it, but costs about 3 s a call here whatever the layer holds (an
empty one included; fuse-overlayfs, Docker 20.10, `scripts/bench/snapshot`), so it cannot run at
every step. The backend-specific equivalent: the storage driver's upper folder
(``GraphDriver.Data.UpperDir``: only the files the container changed, with the driver's own
whiteouts for deletions, character devices 0/0 and ``.wh..wh..opq`` files) is copied as it is,
on the host, into the frozen snapshot (`copy_tree`), and into a child container's upper folder
after the container is created and before it starts, so the storage driver mounts it as that
container's own layer. A copy costs what the layer holds (a freshly set-up container's: a few
files, about a millisecond), not what the image holds.

Root-side safety: the source is the agent's (root in its container may plant anything), so the
copy opens every folder and file relative to its parent's descriptor, following no symbolic link
(``O_NOFOLLOW``), and copies links, devices and FIFOs as what they are, never through them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from docker.models.containers import Container

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def upper_dir(container: Container) -> Path | None:
    """The host folder of `container`'s writable layer (its storage driver's ``UpperDir``); None
    for a driver without one (then no layer is copied)."""
    data = (container.attrs.get("GraphDriver") or {}).get("Data") or {}
    upper = data.get("UpperDir")
    return Path(upper) if isinstance(upper, str) and upper else None


def copy_tree(source: Path, target: Path) -> int:
    """Copy everything in the folder `source` into the existing folder `target`: folders, files,
    links, devices and FIFOs as they are, with owners, modes, times and extended attributes (the
    storage driver's markers); hard links stay linked. Follows no link of `source`.

    Returns:
        The bytes of the regular files copied.

    Raises:
        OSError: a file could not be read or written (ENOSPC when `target`'s disk is full).
    """
    source_fd = os.open(source, _DIRECTORY)
    try:
        target_fd = os.open(target, _DIRECTORY)
        try:
            return _copy_folder(source_fd, target_fd)
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def _copy_folder(source: int, target: int) -> int:
    """Copy the entries of folder descriptor `source` into `target` (`copy_tree`)."""
    copied = 0
    linked: dict[tuple[int, int], str] = {}
    for entry in os.scandir(source):
        info = entry.stat(follow_symlinks=False)
        name = entry.name
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(name, 0o700, dir_fd=target)
            inner_source = os.open(name, _DIRECTORY, dir_fd=source)
            inner_target = os.open(name, _DIRECTORY, dir_fd=target)
            try:
                copied += _copy_folder(inner_source, inner_target)
                _copy_metadata(inner_source, inner_target, info)
            finally:
                os.close(inner_source)
                os.close(inner_target)
            continue
        first = linked.get((info.st_dev, info.st_ino))
        if first is not None:  # linked within the folder (across folders: copied)
            os.link(first, name, src_dir_fd=target, dst_dir_fd=target, follow_symlinks=False)
            continue
        copied += _copy_entry(source, target, name, info)
        if info.st_nlink > 1:
            linked[(info.st_dev, info.st_ino)] = name
    return copied


def _copy_entry(source: int, target: int, name: str, info: os.stat_result) -> int:
    """Copy the non-folder entry `name` of `source` into `target`; the bytes copied."""
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
        os.chown(name, info.st_uid, info.st_gid, dir_fd=target, follow_symlinks=False)
        return 0
    if not stat.S_ISREG(info.st_mode):  # devices (the driver's whiteouts), FIFOs, sockets
        os.mknod(name, info.st_mode, info.st_rdev, dir_fd=target)
        os.chown(name, info.st_uid, info.st_gid, dir_fd=target, follow_symlinks=False)
        _copy_xattrs(source, target, name)
        return 0
    reader = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source)
    try:
        writer = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=target)
        try:
            offset = 0
            while offset < info.st_size:  # in the kernel (copy_file_range refuses across file systems)
                sent = os.sendfile(writer, reader, offset, info.st_size - offset)
                if sent == 0:
                    break
                offset += sent
            _copy_metadata(reader, writer, info)
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    return info.st_size


def _copy_metadata(source: int, target: int, info: os.stat_result) -> None:
    """Give the open `target` the owner, mode, extended attributes and times of `source` (`info`)."""
    os.fchown(target, info.st_uid, info.st_gid)
    os.fchmod(target, stat.S_IMODE(info.st_mode))
    for attribute in os.listxattr(source):
        with contextlib.suppress(OSError):  # a namespace the target's file system lacks
            os.setxattr(target, attribute, os.getxattr(source, attribute))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def _copy_xattrs(source: int, target: int, name: str) -> None:
    """Copy the extended attributes of the special file `name` of folder `source` (not followed)
    to `name` of `target` (made by us: no link on the way)."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=source)
    out = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target)
    try:
        for attribute in os.listxattr(f"/proc/self/fd/{fd}"):
            with contextlib.suppress(OSError):
                os.setxattr(f"/proc/self/fd/{out}", attribute, os.getxattr(f"/proc/self/fd/{fd}", attribute))
    finally:
        os.close(fd)
        os.close(out)
