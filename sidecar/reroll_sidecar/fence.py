"""The fence around a soft verify: whatever the test script does, nothing of it is left afterwards.

Between the rounds of a trial the agent goes on in the same sandbox after the verifier ran there
as root with the hidden tests at hand. Deleting the verifier folder is not enough: code of the
workspace runs inside the verifier (an import-time payload) and could copy the tests anywhere,
or leave a process behind that hands them over later. `Fence` closes both ways:

- **processes**: when the script has ended, every descendant of the sidecar outside its session
  (the sidecar is a child subreaper: a ``setsid`` or double-forked daemon is still its
  descendant) and every process of the agent's user is frozen and killed (`quiesce`), as before
  the script ran, so no process started during the verify survives it;
- **files the agent works on** (the *areas*: the workspace, the agent's and the sidecar's HOME,
  the scratch folders, the logs folder): snapshotted (`SnapshotStore`) when the fence is
  entered, after the agent was quiesced, and restored exactly when it is left — what the
  verifier wrote there (a copy of the tests, caches) is gone, the agent's own work is as it was;
- **every other file the sandbox can write** (the *rest*: each read-write mount of the sandbox,
  ``/proc/self/mountinfo``, but pseudo file systems, less the areas): stamped (type, inode, mode,
  owner, size, times — ``find -printf``; a ctime cannot be forged from user space) when entered
  and again when left. New entries are deleted; a folder whose mode or owner changed gets them
  back; a file, link or device that changed or vanished cannot be put back (its old content was
  not kept), so the fence reports it (`Left.unrecoverable`) and the controller ends the trial
  rather than let the agent go on in a sandbox that may hold the tests. The snapshot of the areas
  lives in the sidecar's state folder, which is part of the rest: tampering with it is such a
  change, and is found before the restore reads it.

Why not a throwaway copy of the sandbox for the verifier (an overlay in a mount namespace, or a
``docker commit`` and a second container): an unprivileged container's root cannot make mounts
or namespaces, and a second container per round costs a commit and a sidecar start; the fence
needs nothing of the backend and costs one snapshot of the areas and two metadata walks. Its
limits: a verifier that changes system files in place (``apt-get install`` rewrites
``/var/lib/dpkg/status``) ends a trial — install such tools in the task's image; read-only
mounts are trusted to stay read-only; state held by a task's service (a database the verifier
writes to) is not covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from reroll_contracts.errors import SnapshotError

from reroll_sidecar import quiesce, snapshot_io
from reroll_sidecar.bundle import tool
from reroll_sidecar.snapshots import SnapshotStore

SNAPSHOT_NAME = "reroll-soft-verify"
PSEUDO_FILE_SYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "mqueue",
        "securityfs",
        "debugfs",
        "tracefs",
        "pstore",
        "bpf",
        "fusectl",
        "configfs",
        "autofs",
        "binfmt_misc",
        "nsfs",
        "hugetlbfs",
        "efivarfs",
    }
)
"""File system types whose entries hold no file the agent could read back later."""
MAX_LISTED = 10
"""How many paths a report names at most."""


def _octal_unescape(field: str) -> str:
    """A mountinfo field with its ``\\NNN`` escapes (space, tab, newline, backslash) decoded."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def _mount_points(mountinfo: str) -> list[tuple[str, bool]]:
    """(mount point, mounted read-write) of every mount of this mount namespace but pseudo file
    systems (`PSEUDO_FILE_SYSTEMS`).

    Raises:
        OSError: `mountinfo` cannot be read.
    """
    found: list[tuple[str, bool]] = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) < 6 or not tail or tail[0] in PSEUDO_FILE_SYSTEMS:
                continue
            found.append((_octal_unescape(fields[4]), "rw" in fields[5].split(",")))
    return found


def writable_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The mount points of this mount namespace that are mounted read-write, pseudo file systems
    (`PSEUDO_FILE_SYSTEMS`) left out, sorted and without repeats.

    Raises:
        OSError: `mountinfo` cannot be read.
    """
    return sorted({point for point, writable in _mount_points(mountinfo) if writable})


def read_only_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The mount points mounted read-only (a shared install, the sidecar's bundle), sorted: inside
    an area they are left out of its snapshot (nothing there can change, and a shared install
    may be large or written by an install of another rollout meanwhile).

    Raises:
        OSError: `mountinfo` cannot be read.
    """
    points = _mount_points(mountinfo)
    writable = {point for point, rw in points if rw}
    return sorted({point for point, rw in points if not rw and point not in writable})


def host_overlay_root(mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether ``/`` is an overlay whose lower layer is a whole root file system (``lowerdir=/``):
    the `local` sandbox before its root view is built from explicit pieces, where walking ``/``
    or root's HOME would walk the host's.

    Raises:
        OSError: `mountinfo` cannot be read.
    """
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as handle:
        for line in handle:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) > 4 and fields[4] == "/" and tail[:1] == ["overlay"]:
                return ",lowerdir=/," in f",{tail[-1]},"
    return False


def _glob_escape(path: str) -> str:
    """`path` as a find ``-path`` pattern matching only itself."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in path)


def _under(path: str, folders: Iterable[str]) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


async def stamp_rest(roots: list[str], pruned: list[str]) -> dict[bytes, bytes]:
    """Stamp every entry below `roots`, each walked on its own file system (``-xdev``), leaving
    out `pruned` folders and what they hold.

    Raises:
        ToolError: find failed.
    """
    stamps: dict[bytes, bytes] = {}
    prune: list[str] = []
    for folder in pruned:
        prune += [*(["-o"] if prune else []), "-path", _glob_escape(folder)]
    for root in roots:
        if _under(root, pruned) or not os.path.lexists(root):
            continue
        argv = [tool("find"), "-P", root, "-xdev"]
        argv += ["(", *prune, ")", "-prune", "-o"] if prune else []
        argv += ["-printf", snapshot_io.STAMP_FORMAT]
        stamps.update(snapshot_io.parse_stamps(await snapshot_io.run(argv)))
    return stamps


@dataclass
class Left:
    """What leaving the fence did."""

    killed: int = 0
    """Processes started during the verify that were frozen and killed."""
    deleted: list[str] = field(default_factory=list)
    """New entries outside the areas, deleted (the topmost of each new tree)."""
    repaired: list[str] = field(default_factory=list)
    """Folders outside the areas whose mode or owner was put back."""
    unrecoverable: list[str] = field(default_factory=list)
    """Entries outside the areas that changed or vanished: the fence cannot undo them."""
    enter_seconds: float = 0.0
    """How long `Fence.enter` took (the snapshot of the areas and the first walk)."""
    leave_seconds: float = 0.0
    """How long `Fence.leave` took (the quiesce, the second walk, the undo and the restore)."""

    def notes(self) -> list[str]:
        """One line per kind of thing done, for the hardening report."""
        lines = [
            f"soft verify fence: {self.killed} processes killed, the agent's folders "
            f"{'left as they are' if self.unrecoverable else 'restored'} "
            f"(entered in {self.enter_seconds:.2f} s, left in {self.leave_seconds:.2f} s)"
        ]
        if self.deleted:
            count = len(self.deleted)
            lines.append(f"soft verify fence: deleted {count} new entries: {_listed(self.deleted)}")
        if self.repaired:
            lines.append(f"soft verify fence: mode or owner put back on {_listed(self.repaired)}")
        return lines

    def error(self) -> str:
        """Why the sandbox cannot go on, or empty."""
        if not self.unrecoverable:
            return ""
        return (
            f"the soft verify changed {len(self.unrecoverable)} entries outside the agent's folders that "
            f"cannot be put back ({_listed(self.unrecoverable)}): the sandbox may now hold the hidden "
            "tests, so the trial cannot go on (a verifier that installs system packages must have them "
            "installed in the task's image)"
        )


def _listed(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_LISTED])
    return shown + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")


class Fence:
    """One soft verify's fence (see the module docstring); `enter` before the script, `leave` after.

    Args:
        snapshots: where the areas' snapshot is kept (its folder belongs to the rest).
        areas: absolute folders the agent works in, restored exactly (missing ones are skipped;
            where the snapshots' folder lies in one, that area is split around it).
        discard: absolute folders deleted when the fence is left (the verifier's folder), never
            walked.
        rest: absolute folders (mount points) walked for every other change; None: every
            read-write mount (`writable_mounts`).
        agent_uid: the agent's user, whose processes are killed too; None: by descent only.
        keep_reaped: pids another thread waits for (Exec's children), never reaped by the quiesce.
        spare: the task's services (`quiesce.Selection.spare`): they outlive the fence.
    """

    def __init__(
        self,
        snapshots: SnapshotStore,
        areas: list[str],
        *,
        discard: Iterable[str] = (),
        rest: list[str] | None = None,
        agent_uid: int | None = None,
        keep_reaped: Iterable[int] = (),
        spare: frozenset[quiesce.Identity] = frozenset(),
    ) -> None:
        self.snapshots = snapshots
        self.areas = split_areas(areas, os.path.dirname(snapshots.root))
        self.discard = [os.path.normpath(folder) for folder in discard]
        self.rest = rest
        self.agent_uid = agent_uid
        self.keep_reaped = keep_reaped
        self.spare = spare
        self._roots: list[str] = []
        self._before: dict[bytes, bytes] | None = None
        self._saved = False
        self._enter_seconds = 0.0

    async def enter(self) -> None:
        """Snapshot the areas, stamp the rest.

        Raises:
            SnapshotError: the snapshot failed. ToolError: find failed. OSError: no mountinfo.
        """
        started = time.monotonic()
        # Not in the snapshot (still pruned from the rest's walk): read-only mounts inside an area
        # (a shared install: large, and written meanwhile by another rollout's install), and the
        # sidecar's own folder, its state folder's parent (local: the root-only control folder,
        # whose log the sidecar writes while tar reads it).
        areas = self.areas
        for excluded in [*read_only_mounts(), os.path.dirname(os.path.dirname(self.snapshots.root))]:
            if any(_under(excluded, [area]) and excluded != area for area in areas):
                areas = split_areas(areas, excluded)
        present = [area for area in areas if os.path.lexists(area)]
        if present:
            await self.snapshots.save(SNAPSHOT_NAME, present)
            self._saved = True
        roots = self.rest if self.rest is not None else writable_mounts()
        self._roots = [os.path.normpath(root) for root in roots]
        self._before = await stamp_rest(self._roots, [*self.areas, *self.discard])
        self._enter_seconds = time.monotonic() - started

    async def leave(self) -> Left:
        """Kill the verify's processes, delete the discarded folders, undo the verify's changes
        to the rest (or report them), restore the areas.

        The areas are restored only when the rest shows no change that cannot be undone (the
        snapshot itself may have been tampered with then).

        Raises:
            QuiesceError: processes outlived the quiesce's time limit.
            SnapshotError: the restore failed (or `enter` did not run). ToolError: find failed.
        """
        if self._before is None:
            raise SnapshotError("failed", "the soft verify fence was left before it was entered")
        started = time.monotonic()
        left = Left(enter_seconds=self._enter_seconds)
        selection = quiesce.Selection(uid=self.agent_uid, descendants=True, spare=self.spare)
        left.killed = await asyncio.to_thread(quiesce.quiesce, selection, keep_reaped=self.keep_reaped)
        for folder in self.discard:
            await asyncio.to_thread(_discard, os.fsencode(folder))
        after = await stamp_rest(self._roots, [*self.areas, *self.discard])
        await asyncio.to_thread(_undo, self._before, after, left)
        if not left.unrecoverable and self._saved:
            await self.snapshots.restore(SNAPSHOT_NAME)
        left.leave_seconds = time.monotonic() - started
        return left


def split_areas(areas: Iterable[str], excluded: str) -> list[str]:
    """`areas`, normalised, nested ones dropped, and an area holding `excluded` replaced by its
    entries but the one on the way to `excluded` (recursively), so `excluded` is in none."""
    tops: list[str] = []
    for area in sorted({os.path.normpath(area) for area in areas}):
        if not _under(area, tops):
            tops.append(area)
    excluded = os.path.normpath(excluded)
    result: list[str] = []
    for area in tops:
        if _under(area, [excluded]):
            continue
        if not _under(excluded, [area]):
            result.append(area)
            continue
        folder = area
        while folder != excluded:
            step = os.path.relpath(excluded, folder).split(os.sep)[0]
            with contextlib.suppress(OSError):
                result += [os.path.join(folder, name) for name in sorted(os.listdir(folder)) if name != step]
            folder = os.path.join(folder, step)
    return result


def _undo(before: dict[bytes, bytes], after: dict[bytes, bytes], left: Left) -> None:
    """Delete what is new in `after`, put back folders' modes and owners, and list what cannot be
    undone in `left`."""
    removed: list[bytes] = []
    for path, stamp in after.items():
        old = before.get(path)
        if old is None:
            if any(path.startswith(top + b"/") for top in removed):
                continue
            try:
                _remove(path)
            except OSError as exc:
                left.unrecoverable.append(f"{os.fsdecode(path)} (new, cannot be deleted: {exc.strerror})")
                continue
            removed.append(path)
            left.deleted.append(os.fsdecode(path))
        elif old != stamp:
            _compare(path, old, stamp, left)
    for path in before.keys() - after.keys():
        left.unrecoverable.append(f"{os.fsdecode(path)} (deleted)")


def _compare(path: bytes, old: bytes, new: bytes, left: Left) -> None:
    """Judge one entry whose stamp changed (see the module docstring)."""
    old_kind, _, _, old_mode, old_uid, old_gid, *_ = old.split(b" ")
    new_kind, _, _, new_mode, new_uid, new_gid, *_ = new.split(b" ")
    if old_kind != new_kind:
        left.unrecoverable.append(f"{os.fsdecode(path)} (replaced)")
        return
    same_owner_mode = (old_mode, old_uid, old_gid) == (new_mode, new_uid, new_gid)
    if old_kind == b"d" or old_kind in (b"c", b"b", b"p", b"s"):
        # A folder changes when entries come and go (they were judged on their own); a device,
        # FIFO or socket holds nothing: only its mode and owner matter.
        if same_owner_mode:
            return
        try:
            os.lchown(path, int(old_uid), int(old_gid))
            os.chmod(path, int(old_mode, 8), follow_symlinks=False)
        except (OSError, NotImplementedError) as exc:
            left.unrecoverable.append(f"{os.fsdecode(path)} (mode or owner changed: {exc})")
            return
        left.repaired.append(os.fsdecode(path))
        return
    left.unrecoverable.append(f"{os.fsdecode(path)} (changed)")


def _discard(folder: bytes) -> None:
    """Delete `folder` and what it holds; a mount point (the local sandbox binds the verifier
    folder) is emptied and kept.

    Raises:
        OSError: an entry cannot be deleted.
    """
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            os.unlink(folder)
            return
    except FileNotFoundError:
        return
    for name in os.listdir(folder):
        _remove(os.path.join(folder, name))
    with contextlib.suppress(OSError):  # EBUSY: a mount point
        os.rmdir(folder)


def _remove(path: bytes) -> None:
    """Delete `path` (a folder with what it holds), following no symlink."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
