"""Named snapshots of paths in the sandbox, restored exactly (contents, modes, owners, symlinks, deletions).

A snapshot is a folder ``<state dir>/snapshots/<name>/`` holding

- ``stamps``: every saved entry's path and stamp (see `snapshot_io`), as GNU find printed them;
- ``content.tar``: the entries, by GNU tar (numeric owners), run side by side with find on the
  two cores — or after it, from its list less the cloned files, where files are cloned;
- ``clones/<n>``: on file systems that clone files (btrfs, XFS with reflink), large regular files
  are not copied into the archive but cloned (FICLONE: no data copied); their metadata is in the
  stamps;
- ``index.json``: the paths asked for, the trusted folder above each (`nofollow`) and the cloned files.

Restore stamps the tree again and touches only what differs: entries that are new or changed type
are deleted; entries that are missing or whose stamp changed (ctime cannot be forged from user
space), and their parent folders, are put back — clones cloned back, the rest streamed to
``tar --extract`` as the byte ranges of just their members, so tar never reads the whole archive.
Restoring after small changes thus costs little whatever the tree's size. Entries that changed
while the snapshot was taken are put back by every restore (`snapshot_io.mark_changing`).
Restores assume nothing writes to the paths while they run (the verifier quiesces the agent
first). Folders above a path, below its trusted folder, are never followed when they are
symlinks: a save refuses them, a restore replaces them by real folders (`nofollow`), so a
restore never writes through a symlinked folder the agent made.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from reroll_contracts.errors import SnapshotError, ToolError
from reroll_contracts.snapshots import NAME_PATTERN

from reroll_sidecar import nofollow, snapshot_io
from reroll_sidecar.bundle import tool

CLONE_MIN_BYTES = 64 * 1024
"""Regular files at least this large are cloned rather than archived where the file system can."""
CTIME_MARGIN_SECONDS = 0.1
"""How far before a snapshot's start a ctime counts as "changed during the snapshot": a file's
ctime comes from the kernel's coarse clock, which lags the real time by up to one tick (≤ 10 ms)."""

ARCHIVE = "content.tar"
STAMPS = "stamps"
INDEX = "index.json"
CLONES = "clones"
_TAR_CREATE = (tool("tar"), "--create", "--numeric-owner", "--directory", "/")
_TAR_LIST = ("--null", "--verbatim-files-from", "--no-unquote", "--files-from", "-")
_TAR_EXTRACT = (
    *(tool("tar"), "--extract", "--file", "-", "--numeric-owner", "--directory", "/"),
    *("--same-permissions", "--delay-directory-restore"),
)


@dataclass(frozen=True)
class Saved:
    """What `SnapshotStore.save` stored."""

    size_bytes: int
    """The archive's size plus the cloned files' sizes (clones share their extents on disk)."""
    method: str
    """``tar`` (everything archived) or ``tar+reflink`` (large files cloned, the rest archived)."""


def _remove(path: bytes) -> None:
    """Delete `path` whatever it is (file, symlink, folder); nothing when it does not exist."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _remove_all(paths: list[bytes]) -> None:
    """`_remove` each of `paths`."""
    for path in paths:
        _remove(path)


def _write_atomically(path: str, data: bytes) -> None:
    """Replace `path` by `data` through a temporary file, so a crash leaves the old or the new."""
    with open(f"{path}.tmp", "wb") as out:
        out.write(data)
    os.replace(f"{path}.tmp", path)


def _size(stamp: bytes) -> int:
    """The size field of a stamp."""
    return int(stamp.split(b" ", 7)[6])


def _put_back_clone(clone: str, path: bytes, stamp: bytes) -> None:
    """Clone `clone` to `path` (replacing what is there) and give it the owner, mode and mtime of `stamp`."""
    _, _, mode, uid, gid, mtime_ns = snapshot_io.stamp_fields(stamp)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        os.unlink(path)  # not truncated in place: another hard link may share its inode
    snapshot_io.clone(clone, path)
    if os.geteuid() == 0:  # as tar: only root gives files away
        os.chown(path, uid, gid)
    os.chmod(path, mode)
    os.utime(path, ns=(mtime_ns, mtime_ns))


class SnapshotStore:
    """Snapshots kept under ``<state_dir>/snapshots``; one save or restore at a time.

    Args:
        state_dir: the sidecar's private folder (created with mode 0700 when missing).
    """

    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, "snapshots")
        self._lock = asyncio.Lock()
        self._can_clone: bool | None = None

    def _folder(self, name: str) -> str:
        if not NAME_PATTERN.match(name):
            raise SnapshotError("invalid", f"snapshot name {name!r} must match {NAME_PATTERN.pattern}")
        return os.path.join(self.root, name)

    async def save(self, name: str, paths: list[str], trusted: dict[str, str] | None = None) -> Saved:
        """Store `paths` (absolute) as snapshot `name`, replacing an older one of that name.

        Args:
            name: the snapshot's name (`NAME_PATTERN`).
            paths: what to store.
            trusted: per path, the folder above it that the agent cannot replace (default: the
                path's own folder); below it, folders that are symlinks are refused.

        Returns:
            The stored size (bytes) and the method (``tar`` or ``tar+reflink``).

        Raises:
            SnapshotError: invalid name or paths (``invalid``), or find, tar or a clone failed (``failed``).
        """
        folder = self._folder(name)
        if not paths or not all(os.path.isabs(path) and os.path.normpath(path) != "/" for path in paths):
            raise SnapshotError(
                "invalid", f"snapshot paths must be absolute, not / and not empty, not {paths!r}"
            )
        normalised = [os.path.normpath(path) for path in paths]
        given = trusted or {}
        tops = {path: os.path.normpath(given.get(path, os.path.dirname(path))) for path in normalised}
        for path, top in tops.items():
            try:
                with nofollow.secure_parent(path, top):
                    pass
            except FileNotFoundError:
                continue  # not there: nothing to save
            except OSError as exc:
                raise SnapshotError("invalid", f"snapshot {name!r}: {exc}") from exc
        async with self._lock:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            staging = f"{folder}.partial"
            await asyncio.to_thread(_remove, os.fsencode(staging))
            os.makedirs(os.path.join(staging, CLONES))
            try:
                saved = await self._save(staging, tops)
            except (ToolError, OSError) as exc:
                raise SnapshotError("failed", f"snapshot {name!r} of {normalised}: {exc}") from exc
            await asyncio.to_thread(_remove, os.fsencode(folder))
            os.replace(staging, folder)
        return saved

    async def _save(self, staging: str, tops: dict[str, str]) -> Saved:
        """Stamp, clone and archive the paths of `tops` (path → trusted folder) into `staging`."""
        paths = list(tops)
        started = time.time() - CTIME_MARGIN_SECONDS
        roots = [os.fsencode(path) for path in paths if os.path.lexists(path)]
        archive = os.path.join(staging, ARCHIVE)
        if self._can_clone is None:
            self._can_clone = await asyncio.to_thread(snapshot_io.can_clone, staging)
        clones: list[bytes] = []
        if self._can_clone:  # stamps first: they tell which files to clone and leave out of the archive
            stamps = await snapshot_io.stamp_trees(roots)
            large = [p for p, s in stamps.items() if s.startswith(b"f 1 ") and _size(s) >= CLONE_MIN_BYTES]
            clones = await asyncio.to_thread(_clone_all, large, os.path.join(staging, CLONES))
            cloned = set(clones)
            listing = b"".join(path[1:] + b"\0" for path in stamps if path not in cloned)
            await snapshot_io.run([*_TAR_CREATE, "--file", archive, "--no-recursion", *_TAR_LIST], [listing])
        else:  # find and tar side by side, on two cores; mark_changing makes that safe
            listing = b"".join(root[1:] + b"\0" for root in roots)
            stamps, _ = await snapshot_io.both(
                snapshot_io.stamp_trees(roots),
                snapshot_io.run([*_TAR_CREATE, "--file", archive, *_TAR_LIST], [listing]),
            )
        snapshot_io.mark_changing(stamps, started)
        _write_atomically(os.path.join(staging, STAMPS), snapshot_io.format_stamps(stamps))
        index = {"paths": paths, "trusted": tops, "clones": [os.fsdecode(path) for path in clones]}
        _write_atomically(os.path.join(staging, INDEX), json.dumps(index).encode())
        size_bytes = os.path.getsize(archive) + sum(_size(stamps[path]) for path in clones)
        return Saved(size_bytes=size_bytes, method="tar+reflink" if clones else "tar")

    async def restore(self, name: str, notes: list[str] | None = None) -> list[str]:
        """Put snapshot `name` back; returns its paths.

        Only what differs is touched (see the module docstring).

        Args:
            name: the snapshot's name.
            notes: where a line is appended for each symlinked folder replaced on the way.

        Raises:
            SnapshotError: no such snapshot (``not_found``), or find, tar or a clone failed (``failed``).
        """
        folder = self._folder(name)
        async with self._lock:
            try:
                with open(os.path.join(folder, INDEX), "rb") as handle:
                    index = json.load(handle)
            except FileNotFoundError:
                raise SnapshotError("not_found", f"no snapshot named {name!r}") from None
            try:
                await self._restore(folder, index, notes if notes is not None else [])
            except (ToolError, OSError) as exc:
                raise SnapshotError("failed", f"restore of snapshot {name!r}: {exc}") from exc
        return list(index["paths"])

    async def _restore(self, folder: str, index: dict[str, Any], notes: list[str]) -> None:
        """Put back what differs from the snapshot in `folder` described by `index`."""
        for path, top in index["trusted"].items():
            with nofollow.secure_parent(path, top, replace=True, notes=notes):
                pass
        with open(os.path.join(folder, STAMPS), "rb") as handle:
            saved = snapshot_io.parse_stamps(handle.read())
        archive = os.path.join(folder, ARCHIVE)
        roots = [os.fsencode(path) for path in index["paths"] if os.path.lexists(path)]
        current, members = await snapshot_io.both(
            snapshot_io.stamp_trees(roots), asyncio.to_thread(snapshot_io.member_ranges, archive)
        )
        stale, wanted = _differences(saved, current)
        clones = {os.fsencode(path): str(number) for number, path in enumerate(index["clones"])}
        unarchived = wanted - members.keys() - clones.keys()
        # Created while the snapshot ran, after tar had passed their folder: absent in the snapshot.
        appeared = {path for path in unarchived if saved[path].endswith(snapshot_io.CHANGING)}
        lost = [path for path in unarchived - appeared if not saved[path].startswith(b"s ")]
        if lost:  # sockets are never archived; anything else missing means a damaged archive
            raise ToolError(f"{archive} lacks {len(lost)} saved entries, such as {os.fsdecode(lost[0])}")
        for path in appeared:
            del saved[path]
        wanted -= appeared
        stale |= appeared & current.keys()
        # Only the topmost stale entries: removing a folder takes what is below it along.
        await asyncio.to_thread(_remove_all, [path for path in stale if os.path.dirname(path) not in stale])
        if not wanted:
            return
        for path in wanted & clones.keys():
            clone = os.path.join(folder, CLONES, clones[path])
            await asyncio.to_thread(_put_back_clone, clone, path, saved[path])
        ranges = [members[path] for path in wanted if path in members]
        await snapshot_io.run([*_TAR_EXTRACT], snapshot_io.read_ranges(archive, ranges))
        # Put-back entries have new inodes and ctimes: record them, so the next restore skips them.
        # Best effort: without it, the next restore puts them back once more.
        try:
            saved.update(await snapshot_io.stamp_entries([path for path in saved if path in wanted]))
        except ToolError:
            return
        _write_atomically(os.path.join(folder, STAMPS), snapshot_io.format_stamps(saved))


def _differences(saved: dict[bytes, bytes], current: dict[bytes, bytes]) -> tuple[set[bytes], set[bytes]]:
    """What a restore deletes and what it puts back, from the saved and the current stamps.

    Returns:
        The stale entries (new, or of another type than saved) and the wanted ones (missing or
        stamped differently, and the folders above them: putting an entry back changes its
        folder's mtime).
    """
    stale = {path for path, stamp in current.items() if saved.get(path, b"")[:1] != stamp[:1]}
    wanted = {path for path, stamp in saved.items() if current.get(path) != stamp}
    for path in list(wanted):
        parent = os.path.dirname(path)
        while parent in saved and parent not in wanted:
            wanted.add(parent)
            parent = os.path.dirname(parent)
    return stale, wanted


def _clone_all(paths: list[bytes], folder: str) -> list[bytes]:
    """Clone each of `paths` it can to ``folder/<n>``, n counting from 0; returns those cloned.

    A file on another file system than `folder` (EXDEV) or one refusing clones is left out: the
    archive takes it.

    Raises:
        OSError: reading a file failed otherwise.
    """
    cloned: list[bytes] = []
    for path in paths:
        try:
            snapshot_io.clone(path, os.path.join(folder, str(len(cloned))))
        except OSError as exc:
            if exc.errno not in snapshot_io.NO_CLONE_ERRORS:
                raise
            continue
        cloned.append(path)
    return cloned
