"""Reading a file of a folder that may come from anyone (a shared run folder, a downloaded job).

A run folder is data: `read_data_file` is the one way reroll reads a file of it. It never follows
a symlink (the file itself, and with `root` every folder between `root` and the file), never
waits on a FIFO or a device (the file is opened non-blocking and must be a regular file), and
never reads past a cap given per kind of file (a 2 GiB sparse ``config.json`` is refused from its
size, before a byte is read). Each refusal is a `DataFileError` saying why and, for the size, the
cap; callers prefix the file's path.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DataFileError(ValueError):
    """A data file refused: a symlink (or a folder on the way that is one), not a regular file (a
    FIFO, a device, a folder), or larger than its cap. The message is the reason, without the path."""


def _size(limit_bytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if limit_bytes >= scale and limit_bytes % scale == 0:
            return f"{limit_bytes // scale} {unit}"
    return f"{limit_bytes} bytes"


def _open_below(root: Path, relative: Path) -> int:
    """A descriptor of ``root / relative`` opened with `READ_FLAGS`, every folder below `root`
    opened without following a symlink."""
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise DataFileError(f"{relative} is not a path inside {root}")
    folder = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the folder the user named: resolved as given
    try:
        for part in relative.parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise DataFileError(
                        f"its folder {part} is a symlink or not a folder; not followed"
                    ) from exc
                raise
            os.close(folder)
            folder = child
        return os.open(relative.parts[-1], READ_FLAGS, dir_fd=folder)
    finally:
        os.close(folder)


def read_data_file(path: Path, limit_bytes: int, *, root: Path | None = None) -> bytes:
    """The content of the regular file `path`, read without following a symlink or waiting.

    Args:
        path: the file.
        limit_bytes: the cap for this kind of file; a larger file is refused unread.
        root: the folder `path` lies in (a run folder); no symlink between it and `path` is
            followed either. None: only `path` itself must not be a symlink.

    Returns:
        The whole content (at most `limit_bytes` bytes).

    Raises:
        FileNotFoundError: `path` (or a folder on the way) does not exist.
        OSError: it cannot be opened or read (no permission).
        DataFileError: it (or, with `root`, a folder on the way) is a symlink; it is not a regular
            file (a FIFO, a device, a folder); it is larger than `limit_bytes` (the message gives
            its size and the cap); `path` is not below `root`.
    """
    if root is not None and not path.is_relative_to(root):
        raise DataFileError(f"not inside {root}")
    try:
        fd = _open_below(root, path.relative_to(root)) if root is not None else os.open(path, READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DataFileError("a symlink; files of a run folder are never followed out of it") from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise DataFileError(f"not a regular file (mode {stat.filemode(info.st_mode)}); not read")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit_bytes:
            raise DataFileError(
                f"{info.st_size} bytes, more than the cap of {_size(limit_bytes)} for this file"
            )
        data = handle.read(limit_bytes + 1)
    if len(data) > limit_bytes:  # it grew while read
        raise DataFileError(f"more than the cap of {_size(limit_bytes)} for this file")
    return data
