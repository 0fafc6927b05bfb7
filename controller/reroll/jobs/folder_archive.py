"""Folders that travel between machines as bytes: a task folder to a Ray worker, a run folder back.

A single file travels as a folder holding it (`pack_file`).

`pack` makes a gzip-compressed tar (POSIX pax) of a folder in memory, with a content hash of what it
holds (names, kinds, permission bits, file contents and link targets; not times or owners), so the
same folder packed twice, on any machine, gets the same `PackedFolder.digest`. `unpack` writes one
into a new folder and trusts nothing in it: a member with an absolute name, a ``..`` part or a
name under a link, a link whose target leaves the folder, a hard link, a device or a FIFO is
refused before anything of it is written (a run folder comes from the machine the agent ran on).

Sizes: the archive is held in memory whole; task and run folders are small (kilobytes to a few
megabytes).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from reroll_contracts.errors import JobError, RunFolderError


@dataclass(frozen=True)
class PackedFolder:
    """A folder as bytes (`pack`)."""

    digest: str
    """sha256 (hex) of the folder's content, as described in the module docstring."""
    data: bytes
    """The gzip-compressed tar of the folder; members are named relative to it (POSIX)."""


def pack(folder: Path) -> PackedFolder:
    """Pack `folder`: its files, sub-folders and links (kept as links, never followed); sockets,
    FIFOs and devices are left out.

    Raises:
        JobError: a link in `folder` points outside it (absolute, or up through ``..``).
        OSError: `folder` cannot be read (e.g. it does not exist).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a folder")
    return _pack(folder, [(path, path.relative_to(folder).as_posix()) for path in _walk(folder)])


def pack_file(file: Path) -> PackedFolder:
    """Pack the one regular file `file` as a folder holding it under its own name (a file an
    attempt reads outside any folder that travels: a ``scripted:PATH`` model's script).

    Raises:
        JobError: `file` is a link, or not a regular file (a FIFO, a device, a folder).
        OSError: `file` cannot be read (e.g. it does not exist).
    """
    file = Path(file)
    if not stat.S_ISREG(os.lstat(file).st_mode):
        raise JobError(f"{file}: not a regular file (a link, a folder or a special file); it cannot travel")
    return _pack(file.parent, [(file, file.name)])


def _pack(folder: Path, entries: list[tuple[Path, str]]) -> PackedFolder:
    """The archive of `entries` (a path, and its name in the archive), parents before children;
    `folder` is the root links are checked against (named in errors)."""
    content = hashlib.sha256()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, name in entries:
            info = _member(path, name)
            if info is None:
                continue  # a socket, FIFO or device (a process's endpoint, not content): left out
            if info.issym():
                if not _inside(PurePosixPath(name).parent, info.linkname):
                    raise JobError(f"{path}: a link to {info.linkname}, outside {folder}; it cannot travel")
                content.update(b"l\0" + name.encode() + b"\0" + info.linkname.encode() + b"\0")
                archive.addfile(info)
            elif info.isdir():
                content.update(f"d\0{name}\0{info.mode:o}\0".encode())
                archive.addfile(info)
            elif info.isreg():
                data = path.read_bytes()
                info.size = len(data)
                content.update(f"f\0{name}\0{info.mode:o}\0{len(data)}\0".encode() + data)
                archive.addfile(info, io.BytesIO(data))
    return PackedFolder(content.hexdigest(), gzip.compress(raw.getvalue(), compresslevel=6, mtime=0))


def _member(path: Path, name: str) -> tarfile.TarInfo | None:
    """The tar header of `path` named `name` (owners left out, every file whole: a hard link is
    packed as a file), or None for what is neither a file, a folder nor a link."""
    status = os.lstat(path)
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = stat.S_IMODE(status.st_mode) & 0o777, int(status.st_mtime)
    if stat.S_ISLNK(status.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISDIR(status.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISREG(status.st_mode):
        info.type = tarfile.REGTYPE
    else:
        return None
    return info


def _walk(folder: Path) -> list[Path]:
    """Everything under `folder` (not itself), parents before children, sorted; links not followed."""
    found: list[Path] = []
    for top, dirs, files in os.walk(folder):
        found.extend(Path(top) / name for name in sorted([*dirs, *files]))
    return sorted(found, key=lambda path: path.relative_to(folder).parts)


def _inside(parent: PurePosixPath, target: str) -> bool:
    """Whether link target `target`, read from the folder `parent` (relative to the packed folder's
    root), stays inside the root: relative, and never climbing above it."""
    if PurePosixPath(target).is_absolute():
        return False
    depth = len(parent.parts)
    for part in PurePosixPath(target).parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return False
    return True


def unpack(data: bytes, target: Path, *, source: str) -> None:
    """Write the folder packed in `data` to `target`, which must not exist yet; it appears whole or
    not at all (written beside it, then renamed). `source` names the archive in errors.

    Raises:
        RunFolderError: `data` is not such an archive, or a member is unsafe (module docstring);
            nothing is left at `target` then.
        FileExistsError: `target` exists already.
        OSError: `target`'s parent cannot be written.
    """
    if target.exists():
        raise FileExistsError(f"{target}: exists already")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _extract(data, staging, source)
        try:
            os.rename(staging, target)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(f"{target}: exists already") from exc
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _extract(data: bytes, root: Path, source: str) -> None:
    """Check every member of the archive `data`, then write them all under `root`."""
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r:") as archive:
            members = archive.getmembers()
            _check(members, source)
            for member in members:
                _write(archive, member, root)
    except (EOFError, tarfile.TarError, gzip.BadGzipFile) as exc:
        raise RunFolderError(f"{source}: not a packed folder: {exc}") from exc


def _check(members: list[tarfile.TarInfo], source: str) -> None:
    """Refuse the whole archive if one member is unsafe (module docstring)."""
    links: set[PurePosixPath] = set()
    for member in members:
        name = PurePosixPath(member.name)
        if name.is_absolute() or not name.parts or ".." in name.parts:
            raise RunFolderError(f"{source}: refused member {member.name!r}: absolute or climbing out")
        if any(parent in links for parent in name.parents):
            raise RunFolderError(f"{source}: refused member {member.name!r}: it lies under a link")
        if member.issym():
            if not _inside(name.parent, member.linkname):
                raise RunFolderError(
                    f"{source}: refused link {member.name!r} to {member.linkname!r}: outside"
                )
            links.add(name)
        elif not (member.isdir() or member.isreg()):
            raise RunFolderError(f"{source}: refused member {member.name!r}: not a file, folder or link")


def _write(archive: tarfile.TarFile, member: tarfile.TarInfo, root: Path) -> None:
    """Write one checked member under `root`: permission bits kept (set-id bits dropped), files'
    times kept, owners not."""
    path = root / member.name
    path.parent.mkdir(parents=True, exist_ok=True)
    if member.issym():
        os.symlink(member.linkname, path)
    elif member.isdir():
        path.mkdir(exist_ok=True)
        path.chmod(stat.S_IMODE(member.mode) & 0o777 | 0o700)
    else:
        extracted = archive.extractfile(member)
        assert extracted is not None  # a regular file
        with open(path, "xb") as out:  # x: never through a link that is already there
            shutil.copyfileobj(extracted, out)
        path.chmod(stat.S_IMODE(member.mode) & 0o777)
        os.utime(path, (member.mtime, member.mtime))
