"""Copy-on-write snapshots of a docker sandbox: its sized folders in one btrfs subvolume, its own
writable layer copied beside it, and pools that children start from.

Where btrfs-progs is installed (`reroll.sandbox.local.cow.available`), the container's sized file
system (`reroll.sandbox.docker.disk`) is btrfs, as the isolated `local` sandbox's. Its folders (the
workspace, ``/tmp``, ``/var/tmp``, ``/home``, ``/root``) are folders of one subvolume, `STATE`,
each bind-mounted into the container as a volume; the logs are a subvolume of their own, never
frozen (each child writes its own). One subvolume, so a snapshot of every folder is one ioctl
(a btrfs snapshot commits a transaction: about 1 ms each, so five subvolumes cost five). Then
(`CowDisk`):

- a snapshot is a read-only snapshot of `STATE` at ``<disk>/snapshots/<name>/0`` (milliseconds
  whatever the folders hold; its storage grows with the bytes changed since), `FOLDERS_FILE`
  naming each container path's folder in it and `reroll_contracts.btrfs.PATHS` (written last)
  the paths a restore brings back; the container cannot reach it (its volumes are the folders,
  never the disk), and the kernel refuses writes to it whoever asks. A pool snapshot
  (`CowDisk.freeze`, a recording's checkpoint at a step) also copies the container's own layer
  into it (`LAYER`, `reroll.sandbox.docker.upper`);
- a restore in the running container is a writable snapshot of the read-only one, at
  ``<disk>/live/<n>``, whose folders are mounted over the container's in its mount namespace
  (`reroll.sandbox.local.cow.mount_into`, from the host), replacing a previous restore's; a
  restore taken earlier no path uses any more is deleted. A later snapshot of paths that all lie
  in one subvolume (all restored by one restore, or none) snapshots that one; other path lists
  take the sidecar's tar path;
- a container made with ``keep_snapshots`` (or that took a pool snapshot) leaves its disk mounted
  when it stops, holding only its frozen snapshots: a *pool* (`reroll.sandbox.local.storage`: the
  same ``PoolSnapshot`` references, retention and prune as local's; docker's pools are named
  `reroll.sandbox.docker.disk.PREFIX`…). A container made with ``from_snapshot`` gets a folder of
  its own on the pool (`CowDisk.child_of`): `STATE` a writable snapshot of the frozen one — no
  copy — and the frozen layer copied into its container's upper folder before the container
  starts. Children run at the same time, each over its own writable layer: none sees another's
  writes, none can write the frozen ones.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.btrfs import PATHS, create_subvolume, delete_subvolume, is_subvolume, snapshot_subvolume
from reroll_contracts.errors import SandboxError

from reroll.sandbox.docker import disk
from reroll.sandbox.docker.disk import PREFIX, SizedDisk
from reroll.sandbox.docker.upper import copy_tree
from reroll.sandbox.local import cow
from reroll.sandbox.local.storage import CHILDREN, PoolSnapshot, keep_as_pool, remove_child

STATE = "state"
"""The subvolume holding the frozen folders (one folder each, by the names the backend gives)."""
LOGS = "logs"
"""The folder name of the logs: a subvolume of its own beside `STATE`, never frozen."""
LAYER = "layer"
"""In a frozen snapshot's folder: the copy of the container's own writable layer (a subvolume)."""
FOLDERS_FILE = "folders.json"
"""In a frozen snapshot's folder: ``{container path: its folder's name in the snapshot}``."""
Folders = dict[str, tuple[str, int]]
"""Container path → (its folder's name on the disk, its mode)."""


@dataclass
class CowDisk:
    """A docker sandbox's btrfs disk, or its folder on a pool (see the module docstring).

    Attributes:
        disk: the sized file system (a pool's, for a child).
        base: the folder holding `STATE`, `LOGS` and the snapshots (the mount point, or a
            child's folder on a pool).
        folders: container path → its folder's name in `STATE` (every sized folder but the logs).
        live: container path → the subvolume its folder is in now (`STATE`, or a restore's).
        layer_from: a child's frozen container layer (`LAYER`) to copy into its container; None.
    """

    disk: SizedDisk
    base: Path
    folders: dict[str, str]
    live: dict[str, Path] = field(default_factory=dict)
    layer_from: Path | None = None
    restores: int = 0
    """How many restores were made (names the writable snapshots)."""

    def __post_init__(self) -> None:
        self.live = self.live or dict.fromkeys(self.folders, self.base / STATE)

    @property
    def is_child(self) -> bool:
        """Whether this is a folder of a pool."""
        return self.base != self.disk.mountpoint

    def host(self, name: str) -> Path:
        """The host path of the folder `name` (one of `Folders`' names): what its volume binds."""
        return self.base / LOGS if name == LOGS else self.base / STATE / name

    @classmethod
    def create(cls, run_id: str, size_bytes: int, folders: Folders, owner: str) -> CowDisk:
        """Make a btrfs disk of `size_bytes` (`SizedDisk.create`) with `STATE` holding `folders`
        (`LOGS` a subvolume of its own).

        Raises:
            SandboxError: the disk could not be made (not root, no loop device); nothing is left.
        """
        made = SizedDisk.create(run_id, size_bytes, {}, owner, prefix=PREFIX, filesystem="btrfs")
        try:
            made_disk = cls._lay_out(made, made.mountpoint, folders, None, {})
        except BaseException as exc:
            disk.remove(made.folder)
            if isinstance(exc, OSError):
                raise SandboxError(f"the sandbox's btrfs disk: {exc}") from exc
            raise
        return made_disk

    @classmethod
    def child_of(cls, source: PoolSnapshot, child: str, folders: Folders, owner: str) -> CowDisk:
        """Lay out the folder `child` (a name) on `source`'s pool: `STATE` a writable snapshot of
        the frozen one (an empty folder for a path it lacks), `LOGS` empty.

        Raises:
            SandboxError: the snapshot holds paths this sandbox lacks, or the file system refused.
        """
        pool = SizedDisk(source.pool, (source.pool / disk.IMAGE).stat().st_size, "btrfs")
        base = pool.mountpoint / CHILDREN / child
        try:
            frozen = _frozen_folders(source.frozen)
            base.mkdir(parents=True, mode=0o700)
            (base / disk.OWNER).write_text(owner)
            made = cls._lay_out(pool, base, folders, source.frozen / "0", frozen)
        except (OSError, ValueError) as exc:
            remove_child(base)
            raise SandboxError(f"a sandbox from snapshot {source}: {exc}") from exc
        theirs = {path: name for path, (name, _) in folders.items()}
        if any(theirs.get(path) != name for path, name in frozen.items()):
            remove_child(base)
            raise SandboxError(f"snapshot {source} holds {sorted(frozen)}, not this sandbox's paths")
        layer = source.frozen / LAYER
        made.layer_from = layer if is_subvolume(layer) else None
        return made

    @classmethod
    def _lay_out(
        cls, sized: SizedDisk, base: Path, folders: Folders, frozen: Path | None, held: dict[str, str]
    ) -> CowDisk:
        """`STATE` (a writable snapshot of `frozen`, or empty), `LOGS`, the snapshot folders, and
        each of `folders` not `held` in `frozen` made with its mode. Raises OSError."""
        if frozen is None:
            create_subvolume(base / STATE)
        else:
            snapshot_subvolume(frozen, base / STATE, readonly=False)
        create_subvolume(base / LOGS)
        for name in (cow.SNAPSHOTS, cow.LIVE):
            (base / name).mkdir(mode=0o700)
        for path, (name, mode) in folders.items():
            if name != LOGS and path not in held:
                (base / STATE / name).mkdir()
                (base / STATE / name).chmod(mode)
        (base / LOGS).chmod(folders_mode(folders, LOGS))
        inside = {path: name for path, (name, _) in folders.items() if name != LOGS}
        return cls(sized, base, inside)

    def covers(self, paths: list[str]) -> bool:
        """Whether a snapshot of `paths` (container paths) can be copy-on-write: each is one of
        the frozen folders' paths, none twice, all now in one subvolume (`STATE`, or one restore's)."""
        if not paths or not set(paths) <= self.folders.keys() or len(set(paths)) != len(paths):
            return False
        return len({self.live[path] for path in paths}) == 1

    def snapshot(self, name: str, paths: list[str], upper: Path | None = None) -> None:
        """Take snapshot `name` (replacing one of that name): `STATE` read-only, `paths` the ones a
        restore brings back, and with `upper` (the container's writable layer's host folder) a copy
        of that layer (`LAYER`).

        Raises:
            SandboxError: a bad name, a restore happened since the start (`STATE` is not what the
                container sees), or the file system refused (ENOSPC: the disk is full).
        """
        folder = cow.snapshot_folder(self.base / cow.SNAPSHOTS, name)
        if not self.covers(paths):
            raise SandboxError(f"copy-on-write snapshot {name!r}: {paths} are not in one subvolume")
        copying: threading.Thread | None = None
        failed: list[OSError] = []
        try:
            cow.drop_snapshot(folder)
            folder.mkdir(mode=0o700)
            if upper is not None:  # beside the ioctl (which releases the GIL): a step waits for the longer
                create_subvolume(folder / LAYER)
                copying = threading.Thread(target=_copy_into, args=(upper, folder / LAYER, failed))
                copying.start()
            snapshot_subvolume(self.live[paths[0]], folder / "0", readonly=True)
            if copying is not None:
                copying.join()
                copying = None
            if failed:
                raise failed[0]
            (folder / FOLDERS_FILE).write_text(json.dumps(self.folders))
            (folder / PATHS).write_text("\n".join(paths))  # last: a folder without it is no snapshot
        except OSError as exc:
            if copying is not None:
                copying.join()
            with contextlib.suppress(OSError):
                cow.drop_snapshot(folder)
            raise SandboxError(f"copy-on-write snapshot {name!r}: {exc}") from exc

    def frozen_paths(self) -> list[str]:
        """The container paths a pool snapshot freezes: every sized folder but the logs."""
        return list(self.folders)

    def freeze(self, name: str, upper: Path | None) -> None:
        """Take pool snapshot `name` of every frozen folder and the container's layer (`snapshot`).

        Raises:
            SandboxError: as `snapshot`.
        """
        self.snapshot(name, self.frozen_paths(), upper)

    def has(self, name: str) -> bool:
        """Whether a copy-on-write snapshot `name` exists."""
        return cow.has_snapshot(self.base / cow.SNAPSHOTS, name)

    def forget(self, name: str) -> None:
        """Delete snapshot `name` if there is one.

        Raises:
            SandboxError: a bad name, or the file system refused.
        """
        cow.forget_snapshot(self.base / cow.SNAPSHOTS, name)

    def restore(self, name: str, pid: int) -> list[str]:
        """Mount the folders of a writable snapshot of snapshot `name` over its paths in the mount
        namespace of process `pid` (the container's first), deleting the restores no path uses
        any more.

        Returns:
            The container paths restored (as given to `snapshot`).

        Raises:
            SandboxError: no such snapshot, or the file system or a mount failed.
        """
        folder = cow.snapshot_folder(self.base / cow.SNAPSHOTS, name)
        try:
            paths = (folder / PATHS).read_text().split("\n")
            names = _frozen_folders(folder)
        except (OSError, ValueError) as exc:
            raise SandboxError(f"no snapshot named {name!r}") from exc
        try:
            self.restores += 1
            fresh = self.base / cow.LIVE / str(self.restores)
            snapshot_subvolume(folder / "0", fresh, readonly=False)
            for path in paths:
                old = self.live[path]
                cow.mount_into(pid, fresh / names[path], path, replace=old != self.base / STATE)
                self.live[path] = fresh
            for old in {*(self.base / cow.LIVE).iterdir()} - {*self.live.values()}:
                delete_subvolume(old)
        except (OSError, KeyError) as exc:
            raise SandboxError(f"restore of copy-on-write snapshot {name!r}: {exc}") from exc
        return paths

    def give_layer(self, upper: Path | None) -> None:
        """Copy a child's frozen layer (`layer_from`) into its new container's writable layer, the
        host folder `upper` (before the container starts); nothing without either.

        Raises:
            SandboxError: the copy failed.
        """
        if self.layer_from is None or upper is None:
            return
        try:
            copy_tree(self.layer_from, upper)
        except OSError as exc:
            raise SandboxError(f"the container's layer from {self.layer_from}: {exc}") from exc

    def release(self, *, keep_snapshots: bool) -> None:
        """At the sandbox's stop (its container and volumes removed): a child removes its folder; a
        disk with `keep_snapshots` and a snapshot becomes a pool, keeping only its snapshots; any
        other disk is unmounted and deleted whole. Never walks the agent's files but a frozen
        layer's (a copy of what the storage driver holds)."""
        if self.is_child:
            with contextlib.suppress(OSError):  # still mounted somewhere: prune removes the pool later
                remove_child(self.base)
        elif keep_snapshots and any((self.base / cow.SNAPSHOTS).iterdir()):
            keep_as_pool(self.disk.folder, self.base, prefix=PREFIX)
        else:
            disk.remove(self.disk.folder)


def _copy_into(upper: Path, layer: Path, failed: list[OSError]) -> None:
    """`copy_tree` of `upper` into `layer`, its error appended to `failed` (a thread's target)."""
    try:
        copy_tree(upper, layer)
    except OSError as exc:
        failed.append(exc)


def folders_mode(folders: Folders, name: str) -> int:
    """The mode `folders` gives the folder `name` (0o755 when it names none)."""
    return next((mode for folder, mode in folders.values() if folder == name), 0o755)


def _frozen_folders(frozen: Path) -> dict[str, str]:
    """``{container path: folder name}`` of the frozen snapshot folder `frozen` (`FOLDERS_FILE`).

    Raises:
        OSError: no such file; ValueError: not such a mapping.
    """
    data = json.loads((frozen / FOLDERS_FILE).read_text())
    if not isinstance(data, dict) or not all(isinstance(v, str) and "/" not in v for v in data.values()):
        raise ValueError(f"{frozen / FOLDERS_FILE}: not a mapping of paths to folder names")
    return {str(path): str(name) for path, name in data.items()}
