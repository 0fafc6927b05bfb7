"""btrfs subvolumes by ioctl, through ctypes (which releases the GIL, unlike ``fcntl.ioctl``): what
the isolated `local` sandbox's copy-on-write snapshots are made of (`reroll.sandbox.local.cow`), and
what the LLM proxy freezes at a held step when the controller asks it to (`reroll_contracts.proxy.
FreezePlan`; `freeze`), so the layout of a frozen snapshot is written in one place.

A frozen snapshot is a folder ``<snapshots>/<name>/`` holding a read-only snapshot of each
subvolume, numbered ``0``, ``1``… in the order of `PATHS` (the file listing their sandbox paths,
one a line, written last: a folder without it is no snapshot), and `ROOT`, the sandbox's ``/``,
when it was frozen too.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from pathlib import Path

PATHS = "paths"
"""The file of a snapshot's folder listing its sandbox paths, one a line, in the order of its subvolumes."""
ROOT = "root"
"""In a snapshot's folder: the frozen ``/`` (the sandbox's root subvolume), when it holds one."""

_BTRFS_IOCTL_MAGIC = 0x94
_VOL_ARGS_BYTES = 4096
_SUBVOL_NAME_MAX = 4039  # BTRFS_SUBVOL_NAME_MAX; the v2 name field holds 4040 bytes
_SUBVOL_RDONLY = 1 << 1
_FIRST_FREE_OBJECTID = 256
"""The inode number of every subvolume's root folder."""


def _iow(number: int) -> int:
    """``_IOW(BTRFS_IOCTL_MAGIC, number, <a 4096-byte argument>)``."""
    return (1 << 30) | (_VOL_ARGS_BYTES << 16) | (_BTRFS_IOCTL_MAGIC << 8) | number


_IOC_SUBVOL_CREATE = _iow(14)
_IOC_SNAP_DESTROY = _iow(15)
_IOC_SNAP_CREATE_V2 = _iow(23)


class _VolArgs(ctypes.Structure):
    """``struct btrfs_ioctl_vol_args``."""

    _fields_ = [("fd", ctypes.c_int64), ("name", ctypes.c_char * (_VOL_ARGS_BYTES - 8))]


class _VolArgsV2(ctypes.Structure):
    """``struct btrfs_ioctl_vol_args_v2`` (no qgroup inheritance)."""

    _fields_ = [
        ("fd", ctypes.c_int64),
        ("transid", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("unused", ctypes.c_uint64 * 4),
        ("name", ctypes.c_char * (_VOL_ARGS_BYTES - 56)),
    ]


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, errno kept (`check`)."""
    return ctypes.CDLL("libc.so.6", use_errno=True)


def check(result: int, what: str) -> int:
    """`result` of a libc call, or OSError with its errno naming `what`."""
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _name_arg(name: str) -> bytes:
    raw = os.fsencode(name)
    if not raw or b"/" in raw or raw in (b".", b"..") or len(raw) > _SUBVOL_NAME_MAX:
        raise ValueError(f"not a subvolume name: {name!r}")
    return raw


def create_subvolume(path: Path) -> None:
    """Make an empty subvolume at `path` (its parent on btrfs; `path` absent).

    Raises:
        OSError: the ioctl failed (EEXIST, ENOTTY when not on btrfs…).
    """
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        args = _VolArgs(fd=0, name=_name_arg(path.name))
        check(libc().ioctl(parent, _IOC_SUBVOL_CREATE, ctypes.byref(args)), f"create subvolume {path}")
    finally:
        os.close(parent)


def snapshot_subvolume(source: Path, target: Path, *, readonly: bool) -> None:
    """Snapshot the subvolume `source` as `target` (absent, on the same file system), read-only
    or writable.

    Raises:
        OSError: the ioctl failed (`source` no subvolume, `target` exists, no space…).
    """
    source_fd = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        parent = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            args = _VolArgsV2(
                fd=source_fd, flags=_SUBVOL_RDONLY if readonly else 0, name=_name_arg(target.name)
            )
            check(
                libc().ioctl(parent, _IOC_SNAP_CREATE_V2, ctypes.byref(args)),
                f"snapshot {source} as {target}",
            )
        finally:
            os.close(parent)
    finally:
        os.close(source_fd)


def delete_subvolume(path: Path) -> None:
    """Delete the subvolume at `path` (read-only or not) with everything in it; nothing when absent.

    Raises:
        OSError: the ioctl failed (EBUSY while mounted somewhere…).
    """
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        args = _VolArgs(fd=0, name=_name_arg(path.name))
        result = libc().ioctl(parent, _IOC_SNAP_DESTROY, ctypes.byref(args))
        if result < 0 and ctypes.get_errno() == errno.ENOENT:
            return
        check(result, f"delete subvolume {path}")
    finally:
        os.close(parent)


def is_subvolume(path: Path) -> bool:
    """Whether `path` (not followed if a link) is the root folder of a btrfs subvolume."""
    try:
        stat = os.lstat(path)
    except OSError:
        return False
    return stat.st_ino == _FIRST_FREE_OBJECTID and os.path.isdir(path) and not os.path.islink(path)


def freeze(folder: Path, sources: list[Path], paths: list[str], root: Path | None = None) -> None:
    """Take a frozen snapshot into `folder` (absent; its parent on the subvolumes' btrfs): a
    read-only snapshot of each subvolume of `sources` as ``0``, ``1``…, of `root` as `ROOT` when
    given, then `PATHS` listing `paths` (the sandbox paths of `sources`, in order).

    Raises:
        OSError: `folder` exists, a source is no subvolume, or the file system refused; what was
            made is left for the caller's cleanup (no `PATHS`: no snapshot).
    """
    folder.mkdir(mode=0o700)
    for index, source in enumerate(sources):
        snapshot_subvolume(source, folder / str(index), readonly=True)
    if root is not None:
        snapshot_subvolume(root, folder / ROOT, readonly=True)
    (folder / PATHS).write_text("\n".join(paths))
