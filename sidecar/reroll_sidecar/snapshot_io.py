"""The tools behind snapshots: entry stamps from GNU find, tar member offsets, reflink clones.

find and tar are the sidecar bundle's own copies when it runs as one (`bundle.tool`).

A *stamp* is one entry's state as GNU find prints it: type, link count, inode, mode, owner,
group, size, mtime and ctime (``f 1 1234 644 0 0 4096 1700000000.1234567890 1700000000.12…``).
Paths and stamps are bytes, exactly as the file system holds them; stamps are compared as
strings, parsed only for a cloned file's metadata and to spot entries changed during a snapshot.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import mmap
import os
from collections.abc import Awaitable, Iterable
from decimal import Decimal
from typing import TypeVar

from reroll_contracts.errors import ToolError

from reroll_sidecar.bundle import tool

A = TypeVar("A")
B = TypeVar("B")

SUBPROCESS_TIMEOUT_SECONDS = 600.0
"""The longest one find or tar run of a snapshot or restore may take."""

STAMP_FORMAT = r"%p\0%y %n %i %m %U %G %s %T@ %C@\0"
"""find -printf format of one entry: its path, then its stamp, each ending in NUL."""

CHANGING = b" changing"
"""Appended to the stamp of an entry that changed while its snapshot was taken: it never
matches the entry's state on disk, so every restore puts such an entry back."""

FICLONE = 0x40049409
"""The Linux ioctl that makes a file share another's extents (``_IOW(0x94, 9, int)``)."""

TAR_BLOCK = 512

NO_CLONE_ERRORS = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})
"""The errors of FICLONE that mean "cannot clone here" rather than a failure."""


async def run(args: list[str], chunks: Iterable[bytes] = ()) -> bytes:
    """Run `args`, feed it `chunks` on stdin, return its stdout.

    Raises:
        ToolError: it exited non-zero (with the tail of its stderr) or took longer than
            SUBPROCESS_TIMEOUT_SECONDS.
    """
    program = os.path.basename(args[0])
    process = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr
    assert stdin is not None and stdout is not None and stderr is not None

    async def feed() -> None:
        try:
            for chunk in chunks:
                stdin.write(chunk)
                await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it exited early; its exit status and stderr tell why
        finally:
            stdin.close()

    try:
        _, output, errors, _ = await asyncio.wait_for(
            asyncio.gather(feed(), stdout.read(), stderr.read(), process.wait()), SUBPROCESS_TIMEOUT_SECONDS
        )
    except TimeoutError:
        raise ToolError(f"{program} took longer than {SUBPROCESS_TIMEOUT_SECONDS:.0f} s") from None
    finally:  # timed out or cancelled: no process left behind
        if process.returncode is None:
            process.kill()
            await process.wait()
    if process.returncode != 0:
        message = errors.decode(errors="replace")[-2000:].strip()
        raise ToolError(f"{program} {args[1]} failed (exit {process.returncode}): {message}")
    return output


async def both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Await `first` and `second` side by side; both finish before an exception of either is raised.

    (A bare ``asyncio.gather`` raises at the first failure and leaves the other running.)
    """
    one, two = await asyncio.gather(first, second, return_exceptions=True)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return one, two  # type: ignore[return-value]


def parse_stamps(listing: bytes) -> dict[bytes, bytes]:
    """Path → stamp, from find's output in STAMP_FORMAT (in find's order: parents first)."""
    parts = listing.split(b"\0")
    parts.pop()  # after the last NUL
    return dict(zip(parts[0::2], parts[1::2], strict=True))


def format_stamps(stamps: dict[bytes, bytes]) -> bytes:
    """The inverse of `parse_stamps`."""
    return b"".join(path + b"\0" + stamp + b"\0" for path, stamp in stamps.items())


async def stamp_trees(roots: list[bytes]) -> dict[bytes, bytes]:
    """Stamp every entry in and below `roots` (existing absolute paths), parents first.

    Raises:
        ToolError: find failed (an unreadable folder, say).
    """
    if not roots:
        return {}
    return parse_stamps(await run([tool("find"), "-P", *map(os.fsdecode, roots), "-printf", STAMP_FORMAT]))


async def stamp_entries(paths: list[bytes]) -> dict[bytes, bytes]:
    """Stamp exactly `paths` (existing absolute paths), not what is below them.

    Raises:
        ToolError: find failed (a path vanished, say).
    """
    if not paths:
        return {}
    listing = b"".join(path + b"\0" for path in paths)
    argv = [tool("find"), "-P", "-files0-from", "-", "-maxdepth", "0", "-printf", STAMP_FORMAT]
    return parse_stamps(await run(argv, [listing]))


def mark_changing(stamps: dict[bytes, bytes], since_seconds: float) -> None:
    """Append CHANGING to the stamps whose ctime is `since_seconds` (Unix time) or later.

    A change made after `since_seconds` gives the entry a ctime at least that late (less one
    clock tick), so a stamp with an older ctime still on disk at restore proves the entry was not
    touched since — whatever find and tar saw while they ran.
    """
    for path, stamp in stamps.items():
        if float(stamp.rsplit(b" ", 1)[1]) >= since_seconds:
            stamps[path] = stamp + CHANGING


def stamp_fields(stamp: bytes) -> tuple[bytes, int, int, int, int, int]:
    """Type, link count, permission bits, owner, group and mtime in ns, from a stamp."""
    kind, links, _, mode, uid, gid, _, mtime = stamp.split(b" ", 8)[:8]
    return kind, int(links), int(mode, 8), int(uid), int(gid), int(Decimal(mtime.decode()) * 10**9)


def _octal_or_base256(field: bytes) -> int:
    """A tar header's number: octal digits, or big-endian base-256 when the top bit is set."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    return int(field.strip(b" \0") or b"0", 8)


def member_ranges(archive: str) -> dict[bytes, tuple[int, int]]:
    """Absolute path → (first byte, end byte) of each member of a GNU tar archive.

    A member's range covers its GNU long-name and long-link headers too, so the concatenation of
    some ranges (plus two zero blocks) is itself a valid archive of just those members. Names are
    made absolute (the archive holds them relative to ``/``) and lose a folder's trailing slash.

    Raises:
        ToolError: the archive is damaged (a header that does not parse, or no end-of-archive block).
    """
    ranges: dict[bytes, tuple[int, int]] = {}
    start = position = 0
    long_name = b""
    try:
        with open(archive, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            while data[position]:  # a zero block ends the archive
                header = data[position : position + TAR_BLOCK]
                size = _octal_or_base256(header[124:136])
                end = position + TAR_BLOCK + (size + TAR_BLOCK - 1) // TAR_BLOCK * TAR_BLOCK
                kind = header[156:157]
                if kind == b"L":
                    long_name = data[position + TAR_BLOCK : position + TAR_BLOCK + size].split(b"\0", 1)[0]
                elif kind != b"K":
                    name = long_name or header[:100].split(b"\0", 1)[0]
                    ranges[b"/" + name.rstrip(b"/")] = (start, end)
                    long_name = b""
                    start = end
                position = end
    except (IndexError, ValueError):  # ValueError: a bad number, or mmap of an empty file
        raise ToolError(f"{archive} is damaged near byte {position}") from None
    return ranges


def read_ranges(archive: str, ranges: list[tuple[int, int]]) -> Iterable[bytes]:
    """The bytes of `ranges` of `archive`, adjacent ones merged, then the end-of-archive blocks."""
    with open(archive, "rb") as handle:
        merged: list[list[int]] = []
        for start, end in sorted(ranges):
            if merged and merged[-1][1] == start:
                merged[-1][1] = end
            else:
                merged.append([start, end])
        for start, end in merged:
            yield os.pread(handle.fileno(), end - start, start)
    yield bytes(2 * TAR_BLOCK)


def clone(source: bytes | str, target: bytes | str) -> None:
    """Make `target` (created or truncated) share `source`'s extents (FICLONE).

    Raises:
        OSError: the file system cannot clone (NO_CLONE_ERRORS) or another failure; `target`
            is then removed.
    """
    with open(source, "rb") as src, open(target, "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:
            os.unlink(target)
            raise


def can_clone(folder: str) -> bool:
    """Whether `folder`'s file system clones files (probed with two scratch files in it)."""
    probe = os.path.join(folder, ".clone-probe")
    try:
        with open(probe, "wb") as out:
            out.write(b"probe")
        clone(probe, f"{probe}.copy")
    except OSError as exc:
        if exc.errno not in NO_CLONE_ERRORS:
            raise
        return False
    finally:
        os.unlink(probe)
        if os.path.lexists(f"{probe}.copy"):
            os.unlink(f"{probe}.copy")
    return True
