"""Named snapshots of paths in the sandbox, restored exactly (contents, modes, owners, symlinks, deletions).

A snapshot is a folder ``<state dir>/snapshots/<name>/`` holding ``content.tar`` (made by GNU
tar with numeric owners) and ``index.json``: the paths asked for and a stamp (inode, mode,
owner, size, mtime, ctime) of every entry saved. Restore compares the tree with the stamps and
touches only what differs: new entries are deleted, missing or changed ones are extracted
again, so restoring after small changes costs little whatever the tree's size. tar works on
every file system, including fuse-overlayfs, where reflinks are not available.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
TAR_TIMEOUT_SECONDS = 600.0


class SnapshotError(Exception):
    """A snapshot request is invalid, or tar failed; `kind` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        """``invalid`` (bad request), ``not_found`` (no such snapshot) or ``failed`` (tar failed)."""


@dataclass(frozen=True)
class Saved:
    """What `SnapshotStore.save` stored."""

    size_bytes: int
    method: str


ARCHIVE = "content.tar"
INDEX = "index.json"
_TAR_OPTIONS = ("--numeric-owner", "--directory", "/")


def _stamp(stat: os.stat_result) -> list[int]:
    """What identifies an entry's state: inode, mode (with type), owner, group, size, mtime, ctime."""
    return [
        stat.st_ino,
        stat.st_mode,
        stat.st_uid,
        stat.st_gid,
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
    ]


def _kind(stamp: list[int]) -> int:
    """The file type bits of a stamp's mode."""
    return stamp[1] & 0o170000


def _walk(paths: list[str], recursive: bool = True) -> dict[str, list[int]]:
    """Stamp every existing path in `paths` and, when `recursive`, everything below them."""
    found: dict[str, list[int]] = {}
    for path in paths:
        try:
            found[path] = _stamp(os.lstat(path))
        except FileNotFoundError:
            continue
        if recursive and os.path.isdir(path) and not os.path.islink(path):
            for base, dirs, files in os.walk(path):
                for name in dirs + files:
                    full = os.path.join(base, name)
                    with contextlib.suppress(FileNotFoundError):
                        found[full] = _stamp(os.lstat(full))
    return found


def _write_index(folder: str, paths: list[str], entries: dict[str, list[int]]) -> None:
    """Write ``index.json`` (the requested paths and every saved entry's stamp) atomically."""
    temp = os.path.join(folder, f"{INDEX}.tmp")
    with open(temp, "w", encoding="utf-8") as out:
        json.dump({"paths": paths, "entries": entries}, out)
    os.replace(temp, os.path.join(folder, INDEX))


def _remove(path: str) -> None:
    """Delete `path` whatever it is (file, symlink, folder); nothing when it does not exist."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


async def _tar(*args: str) -> None:
    """Run GNU tar with `args`; raise SnapshotError("failed") with its stderr on failure."""
    process = await asyncio.create_subprocess_exec(
        "tar", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), TAR_TIMEOUT_SECONDS)
    except TimeoutError:
        process.kill()
        raise SnapshotError("failed", f"tar {args[0]} took longer than {TAR_TIMEOUT_SECONDS:.0f} s") from None
    if process.returncode != 0:
        raise SnapshotError("failed", f"tar {args[0]} failed: {stderr.decode(errors='replace')[-2000:]}")


class SnapshotStore:
    """Snapshots kept under ``<state_dir>/snapshots``.

    Args:
        state_dir: the sidecar's private folder (created with mode 0700 when missing).
    """

    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "snapshots")

    def _folder(self, name: str) -> str:
        if not NAME_PATTERN.match(name):
            raise SnapshotError("invalid", f"snapshot name {name!r} must match {NAME_PATTERN.pattern}")
        return os.path.join(self.root, name)

    async def save(self, name: str, paths: list[str]) -> Saved:
        """Store `paths` (absolute) as snapshot `name`, replacing an older one of that name.

        Raises:
            SnapshotError: invalid name or paths, or tar failed.
        """
        folder = self._folder(name)
        if not paths or not all(os.path.isabs(path) for path in paths):
            raise SnapshotError("invalid", f"snapshot paths must be absolute and not empty, not {paths!r}")
        normalised = [os.path.normpath(path) for path in paths]
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        staging = f"{folder}.partial"
        await asyncio.to_thread(_remove, staging)
        os.makedirs(staging)
        entries = await asyncio.to_thread(_walk, normalised)
        archive = os.path.join(staging, ARCHIVE)
        members = [os.path.relpath(path, "/") for path in normalised if path in entries]
        # -T /dev/null first: GNU tar refuses to create an archive of nothing otherwise.
        await _tar("--create", "--file", archive, *_TAR_OPTIONS, "-T", "/dev/null", "--", *members)
        _write_index(staging, normalised, entries)
        size_bytes = os.path.getsize(archive)
        await asyncio.to_thread(_remove, folder)
        os.replace(staging, folder)
        return Saved(size_bytes=size_bytes, method="tar")

    async def restore(self, name: str) -> list[str]:
        """Put snapshot `name` back; returns its paths.

        Only what differs is touched: entries that are new or changed type are deleted, and
        entries that are missing or whose identity changed (inode, mode, owner, size, mtime,
        ctime — ctime cannot be forged from user space) are extracted again from the archive.

        Raises:
            SnapshotError: no such snapshot (``not_found``), or tar failed.
        """
        folder = self._folder(name)
        try:
            with open(os.path.join(folder, INDEX), encoding="utf-8") as handle:
                saved = json.load(handle)
        except FileNotFoundError:
            raise SnapshotError("not_found", f"no snapshot named {name!r}") from None
        paths: list[str] = saved["paths"]
        entries: dict[str, list[int]] = saved["entries"]
        current = await asyncio.to_thread(_walk, paths)
        stale = [
            path
            for path, stamp in current.items()
            if path not in entries or _kind(stamp) != _kind(entries[path])
        ]
        for path in sorted(stale, key=len):  # parents first: their removal takes the children along
            await asyncio.to_thread(_remove, path)
        wanted = [path for path, stamp in entries.items() if current.get(path) != stamp]
        if wanted:
            member_list = os.path.join(folder, "restore.list")
            with open(member_list, "w", encoding="utf-8") as out:
                out.writelines(os.path.relpath(path, "/") + "\n" for path in wanted)
            archive = os.path.join(folder, ARCHIVE)
            await _tar(
                "--extract",
                "--file",
                archive,
                *_TAR_OPTIONS,
                "--same-permissions",
                "--no-recursion",
                "-T",
                member_list,
            )
            # Extracted entries have new inodes and ctimes: record them, so the next restore skips them.
            entries.update(await asyncio.to_thread(_walk, wanted, False))
            _write_index(folder, paths, entries)
        return paths
