"""Copy-on-write snapshots of a docker sandbox: its sized folders as btrfs subvolumes, its own
writable layer copied beside them, and pools that children start from.

Where btrfs-progs is installed (`reroll.sandbox.local.cow.available`), the container's sized file
system (`reroll.sandbox.docker.disk`) is btrfs, as the isolated `local` sandbox's, and each of its
folders (the workspace, the logs, ``/tmp``, ``/var/tmp``, ``/home``, ``/root``) is a subvolume,
bind-mounted into the container as a volume. Then (`CowDisk`):

- a snapshot is a read-only snapshot of each subvolume, ``<disk>/snapshots/<name>/<i>``
  (`reroll.sandbox.local.cow.Subvolumes`: milliseconds whatever the folders hold); the container
  cannot reach it (its volumes are the folders, never the disk), and the kernel refuses writes
  to it whoever asks. A pool snapshot (`CowDisk.freeze`, a recording's checkpoint at a step)
  also copies the container's own layer into it (`LAYER`, `reroll.sandbox.docker.layer`);
- a restore in the running container is a writable snapshot of the read-only one mounted over
  the folder in the container's mount namespace (`reroll.sandbox.local.cow.mount_into`, from the
  host: the container's PID 1 is the process the namespace is entered by);
- a container made with ``keep_snapshots`` (or that took a pool snapshot) leaves its disk
  mounted when it stops, holding only its frozen snapshots: a *pool*
  (`reroll.sandbox.local.storage`, the same layout, retention and ``PoolSnapshot`` references as
  local's; docker's pools are named `reroll.sandbox.docker.disk.PREFIX`…). A container made with
  ``from_snapshot`` gets a folder of its own on the pool (`CowDisk.child_of`): each folder a
  writable snapshot of the frozen one — no copy — and the frozen layer copied into its container's
  upper folder before the container starts. Children run at the same time, each over its own
  writable layer: none sees another's writes, none can write the frozen ones.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import SandboxError

from reroll.sandbox.docker import disk
from reroll.sandbox.docker.disk import PREFIX, SizedDisk
from reroll.sandbox.docker.layer import copy_tree
from reroll.sandbox.local import cow
from reroll.sandbox.local.storage import CHILDREN, PoolSnapshot, frozen_paths, keep_as_pool, remove_child

LAYER = "layer"
"""In a frozen snapshot's folder: the copy of the container's own writable layer (a subvolume)."""
UNFROZEN = ("/logs",)
"""Sized folders a snapshot never holds: each child writes logs of its own."""
Folders = dict[str, tuple[str, int]]
"""Container path → (its folder's name on the disk, its mode)."""


@dataclass
class CowDisk:
    """A docker sandbox's btrfs disk, or its folder on a pool (see the module docstring).

    Attributes:
        disk: the sized file system (a pool's, for a child).
        base: the folder holding the sandbox's subvolumes (the mount point, or a child's folder).
        subvolumes: the subvolumes, by container path.
        layer_from: a child's frozen container layer (`LAYER`) to copy into its container; None.
    """

    disk: SizedDisk
    base: Path
    subvolumes: cow.Subvolumes
    layer_from: Path | None = None

    @property
    def is_child(self) -> bool:
        """Whether this is a folder of a pool."""
        return self.base != self.disk.mountpoint

    def host(self, name: str) -> Path:
        """The host path of the folder `name` (one of `Folders`' names): what its volume binds."""
        return self.base / name

    @classmethod
    def create(cls, run_id: str, size_bytes: int, folders: Folders, owner: str) -> CowDisk:
        """Make a btrfs disk of `size_bytes` (`SizedDisk.create`) with a subvolume for each of `folders`.

        Raises:
            SandboxError: the disk could not be made (not root, no loop device); nothing is left.
        """
        made = SizedDisk.create(run_id, size_bytes, {}, owner, prefix=PREFIX, filesystem="btrfs")
        base = made.mountpoint
        try:
            for name, mode in folders.values():
                cow.create_subvolume(base / name)
                (base / name).chmod(mode)
            by_path = {path: base / name for path, (name, _) in folders.items()}
            subvolumes = cow.Subvolumes.create(base, by_path, existing=True)
        except BaseException as exc:
            disk.remove(made.folder)
            if isinstance(exc, OSError):
                raise SandboxError(f"the sandbox's btrfs disk: {exc}") from exc
            raise
        return cls(made, base, subvolumes)

    @classmethod
    def child_of(cls, source: PoolSnapshot, child: str, folders: Folders, owner: str) -> CowDisk:
        """Lay out the folder `child` (a name) on `source`'s pool: each of `folders` a writable
        snapshot of the frozen one at its path, an empty subvolume where the snapshot holds none.

        Raises:
            SandboxError: the snapshot holds paths this sandbox lacks, or the file system refused.
        """
        pool = SizedDisk(source.pool, (source.pool / disk.IMAGE).stat().st_size, "btrfs")
        base = pool.mountpoint / CHILDREN / child
        try:
            frozen = dict(frozen_paths(source))
            base.mkdir(parents=True, mode=0o700)
            (base / disk.OWNER).write_text(owner)
            for path, (name, mode) in folders.items():
                if path in frozen:
                    cow.snapshot_subvolume(frozen[path], base / name, readonly=False)
                else:
                    cow.create_subvolume(base / name)
                    (base / name).chmod(mode)
            by_path = {path: base / name for path, (name, _) in folders.items()}
            subvolumes = cow.Subvolumes.create(base, by_path, existing=True)
        except OSError as exc:
            remove_child(base)
            raise SandboxError(f"a sandbox from snapshot {source}: {exc}") from exc
        if set(frozen) - set(folders):
            remove_child(base)
            raise SandboxError(f"snapshot {source} holds {sorted(frozen)}, not this sandbox's paths")
        layer = source.frozen / LAYER
        return cls(pool, base, subvolumes, layer if cow.is_subvolume(layer) else None)

    def frozen_paths(self) -> list[str]:
        """The container paths a pool snapshot freezes: every sized folder but `UNFROZEN`."""
        return [path for path in self.subvolumes.live if path not in UNFROZEN]

    def freeze(self, name: str, upper: Path | None) -> None:
        """Take pool snapshot `name`: a read-only snapshot of each of `frozen_paths`, and a copy of
        the container's writable layer (its host folder `upper`; none when None) as `LAYER`.

        Raises:
            SandboxError: a bad name, or the file system refused (ENOSPC: the disk is full).
        """
        self.subvolumes.freeze(name, self.frozen_paths(), None)
        if upper is None:
            return
        layer = self.base / cow.SNAPSHOTS / name / LAYER
        try:
            cow.create_subvolume(layer)
            copy_tree(upper, layer)
        except OSError as exc:
            self.subvolumes.forget(name)
            raise SandboxError(f"copy-on-write snapshot {name!r}: the container's layer: {exc}") from exc

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
        disk with `keep_snapshots` becomes a pool, keeping only its snapshots; any other disk is
        unmounted and deleted whole. Never walks the agent's files but a frozen layer's."""
        if self.is_child:
            with contextlib.suppress(OSError):  # still mounted somewhere: prune removes the pool later
                remove_child(self.base)
        elif keep_snapshots and any((self.base / cow.SNAPSHOTS).iterdir()):
            keep_as_pool(self.disk.folder, self.subvolumes, prefix=PREFIX)
        else:
            disk.remove(self.disk.folder)
