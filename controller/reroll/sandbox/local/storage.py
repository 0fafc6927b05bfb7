"""Where the isolated `local` sandbox's files live: its sized disk, or a folder of a kept pool.

Each sandbox's writable files (``root``: its ``/``; ``app``: the workspace; ``logs``; ``home``)
are folders of a sized file system (`reroll.sandbox.docker.disk`) that `SandboxDisk` makes, lays
out and removes. Where btrfs-progs is installed the disk is btrfs and every one of those folders
is a subvolume (`reroll.sandbox.local.cow`: the workspace and HOME are snapshotted
copy-on-write, and removing any of them is one ioctl, never a walk of the agent's files).

Snapshots that outlive their sandbox: a sandbox made with ``keep_snapshots`` leaves its disk
mounted when it stops, holding only its read-only snapshots (``<disk>/snapshots/``; every live
subvolume deleted, their blocks given back to the host by ``discard``: the image keeps the bytes
the snapshots changed, not the workspace). The disk is then a *pool*: a sandbox made with
``from_snapshot`` (`PoolSnapshot`: the pool's host folder and a snapshot's name) lays out in a
folder of its own on it, ``<pool>/children/<folder>/``, its workspace and HOME writable snapshots
of the frozen ones — no copy, whatever they hold — and removes only that folder when it stops.
Children run at the same time, each over its own writable layer: none sees another's writes, and
none can reach, let alone write, the frozen layer (read-only to the kernel, outside every
sandbox's root view). They share the pool's size (the recording's ``storage_mb``).

Retention: a pool is removed by ``reroll sandbox prune`` (`prune_local_disks`) when no child of it
runs and it was kept more than `POOL_KEEP_SECONDS` ago or the run folder that recorded it
(`RUN_FILE`, `mark_pool`) is gone; with ``--all``; or by its run id. A sandbox that keeps a pool
removes the oldest pools beyond `POOL_KEEP_COUNT` on the host (`cap_pools`): a recording keeps one
at every step by default, so their number stays bounded without a prune.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from reroll_contracts.btrfs import ROOT
from reroll_contracts.errors import SandboxError
from reroll_contracts.proxy import FreezePlan

from reroll.host.owner import owner_label, owner_runs
from reroll.sandbox.base import PruneReport
from reroll.sandbox.docker import disk
from reroll.sandbox.docker.disk import LOCAL_PREFIX, SizedDisk
from reroll.sandbox.local import cow
from reroll.sandbox.local.identity import reclaim_slots
from reroll.sandbox.local.rootview import IMAGE_ID_BASE, TOP_LEVEL

FOLDERS = ("root", "app", "logs", "home")
"""A sandbox's folders on its disk: ``/``, the workspace, the logs, HOME."""

KEPT = "kept"
"""In a disk's host folder: the time (seconds since the epoch) its sandbox stopped and kept it as a pool."""
CHILDREN = "children"
"""The pool's folder holding its children's folders."""
POOL_KEEP_SECONDS = 24 * 3600
"""How long `prune_local_disks` keeps a pool that nothing uses (``--all`` removes it sooner)."""
POOL_KEEP_COUNT = 16
"""The most pools kept on a host (`cap_pools`): a newly kept pool removes the oldest beyond it."""
IDS_FILE = "ids"
"""In a pool's host folder: the host uid of its sandbox's root (`SandboxDisk.record_ids`); its files
are owned by that range, which a child shifts to its own (`reroll.sandbox.local.identity`)."""
RUN_FILE = "run"
"""In a pool's host folder: the run folder whose checkpoints name its snapshots (`mark_pool`)."""


@dataclass(frozen=True)
class PoolSnapshot:
    """A frozen snapshot of a kept pool: where a child sandbox starts from."""

    pool: Path
    """The pool's host folder (``/tmp/reroll-local-disk-…``; `SizedDisk.folder`)."""
    name: str
    """The snapshot's name (`reroll.sandbox.local.cow.Subvolumes.snapshot`)."""

    @classmethod
    def parse(cls, text: str) -> PoolSnapshot:
        """``<pool folder>:<name>``, as `str` writes it.

        Raises:
            SandboxError: not of that form, or not a kept pool's snapshot.
        """
        folder, _, name = text.rpartition(":")
        source = cls(Path(folder), name)
        if not folder or not (source.frozen / cow.PATHS).is_file() or not (source.pool / KEPT).is_file():
            raise SandboxError(f"from_snapshot {text!r}: no snapshot {name!r} in a kept pool at {folder!r}")
        return source

    @property
    def frozen(self) -> Path:
        """The snapshot's folder on the pool."""
        return self.pool / disk.MOUNTPOINT / cow.SNAPSHOTS / self.name

    @property
    def root(self) -> Path | None:
        """The frozen ``/`` of the snapshot (`SandboxDisk.freeze`), None when it holds none."""
        root = self.frozen / ROOT
        return root if cow.is_subvolume(root) else None

    @property
    def id_base(self) -> int:
        """The host uid of the root of the sandbox that kept the pool (`IDS_FILE`); a pool kept
        before sandboxes had ranges of their own: `IMAGE_ID_BASE`, then every rollout's."""
        try:
            return int((self.pool / IDS_FILE).read_text())
        except (OSError, ValueError):
            return IMAGE_ID_BASE

    def __str__(self) -> str:
        return f"{self.pool}:{self.name}"


@dataclass
class SandboxDisk:
    """One sandbox's files on a sized disk (see the module docstring).

    Attributes:
        disk: the sized file system.
        base: the folder holding `FOLDERS` (the disk's mount point, or a child's folder of a pool).
        cow: the copy-on-write snapshots, when the disk is btrfs.
    """

    disk: SizedDisk
    base: Path
    cow: cow.Subvolumes | None

    root_given: bool = False
    """Whether ``root`` is a writable snapshot of a pool snapshot's frozen ``/`` (`child_of`)."""

    def freeze(self, name: str, paths: list[str], *, root: bool) -> None:
        """Take copy-on-write snapshot `name` of the subvolumes at `paths` (sandbox paths: the
        workspace and HOME), and with `root` of ``/`` too (``/tmp``, ``/var``, services' files;
        `ROOT` in its folder): a pool snapshot.

        Raises:
            SandboxError: no copy-on-write here, a bad name, or the file system refused.
        """
        if self.cow is None:
            raise SandboxError(f"copy-on-write snapshot {name!r}: the disk is not btrfs")
        self.cow.freeze(name, paths, self.base / "root" if root else None)

    def freeze_plan(self, paths: list[str], *, root: bool) -> FreezePlan:
        """What the LLM proxy needs to take `freeze`'s snapshots itself at each held step
        (`reroll_contracts.proxy.FreezePlan`: ``step-K`` into this disk's snapshots folder).

        Raises:
            SandboxError: no copy-on-write here, or `paths` are not among its subvolumes.
        """
        if self.cow is None or not self.cow.covers(paths):
            raise SandboxError(f"no copy-on-write snapshot of {paths} on this disk")
        return FreezePlan(
            snapshots=self.base / cow.SNAPSHOTS,
            sources=[self.cow.live[path] for path in paths],
            paths=paths,
            root=self.base / "root" if root else None,
        )

    def record_ids(self, id_base: int) -> None:
        """Note in the disk's host folder that its files are owned by the range of `id_base`
        (`PoolSnapshot.id_base` reads it)."""
        (self.disk.folder / IDS_FILE).write_text(str(id_base))

    def path(self, name: str) -> Path:
        """The host path of the folder `name` (one of `FOLDERS`, or below one)."""
        return self.base / name

    @property
    def is_child(self) -> bool:
        """Whether this is a folder of a pool (its workspace and HOME came from a snapshot)."""
        return self.base != self.disk.mountpoint

    @classmethod
    def create(
        cls, run_id: str, size_bytes: int, sandbox_paths: dict[str, str], *, copy_on_write: bool
    ) -> SandboxDisk:
        """Make a disk of `size_bytes` and its folders; btrfs with subvolumes where `copy_on_write`
        and btrfs-progs is installed, else ext4.

        Args:
            run_id: the rollout's id (part of the disk's folder name).
            size_bytes: the disk's size.
            sandbox_paths: ``{"app": workspace, "home": HOME}``, the sandbox paths of those folders.
            copy_on_write: False: ext4 whatever is installed.

        Raises:
            SandboxError: the disk could not be made (not root, no loop device), nothing left behind.
        """
        filesystem: Literal["ext4", "btrfs"] = "btrfs" if copy_on_write and cow.available() else "ext4"
        made = SizedDisk.create(
            run_id, size_bytes, {}, owner_label(), prefix=LOCAL_PREFIX, filesystem=filesystem
        )
        try:
            base = made.mountpoint
            subvolumes = None
            if filesystem == "btrfs":
                for name in ("root", "logs"):
                    cow.create_subvolume(base / name)
                folders = {sandbox_paths[name]: base / name for name in ("app", "home")}
                subvolumes = cow.Subvolumes.create(base, folders)
            for name in FOLDERS:
                (base / name).mkdir(exist_ok=True)
        except BaseException as exc:
            disk.remove(made.folder)
            if isinstance(exc, OSError):
                raise SandboxError(f"the sandbox's disk: {exc}") from exc
            raise
        return cls(made, base, subvolumes)

    @classmethod
    def child_of(cls, source: PoolSnapshot, child: str, sandbox_paths: dict[str, str]) -> SandboxDisk:
        """Lay out the folder `child` (a name) on `source`'s pool: ``logs`` empty, ``/``, the
        workspace and HOME writable snapshots of the frozen ones (an empty ``/`` or HOME when the
        snapshot holds none).

        Raises:
            SandboxError: the snapshot is not of these sandbox paths, or the file system refused.
        """
        image = source.pool / disk.IMAGE
        pool = SizedDisk(source.pool, image.stat().st_size, "btrfs")
        base = pool.mountpoint / CHILDREN / child
        frozen = dict(frozen_paths(source))
        try:
            base.mkdir(parents=True, mode=0o700)
            (base / disk.OWNER).write_text(owner_label())
            cow.create_subvolume(base / "logs")
            if source.root is not None:
                cow.snapshot_subvolume(source.root, base / "root", readonly=False)
                for link in TOP_LEVEL:  # the links bwrap made there; it makes them again
                    if (base / "root" / link.lstrip("/")).is_symlink():
                        (base / "root" / link.lstrip("/")).unlink()
            else:
                cow.create_subvolume(base / "root")
            for name in ("app", "home"):
                if sandbox_paths[name] in frozen:
                    cow.snapshot_subvolume(frozen[sandbox_paths[name]], base / name, readonly=False)
                else:
                    cow.create_subvolume(base / name)
            folders = {sandbox_paths[name]: base / name for name in ("app", "home")}
            subvolumes = cow.Subvolumes.create(base, folders, existing=True)
        except OSError as exc:
            remove_child(base)
            raise SandboxError(f"a sandbox from snapshot {source}: {exc}") from exc
        if set(frozen) - set(folders):
            remove_child(base)
            raise SandboxError(f"snapshot {source} holds {sorted(frozen)}, not this sandbox's paths")
        return cls(pool, base, subvolumes, root_given=source.root is not None)

    def release(self, *, keep_snapshots: bool) -> None:
        """At the sandbox's stop: a child removes its folder; a disk with `keep_snapshots` (and
        copy-on-write) becomes a pool, keeping only its snapshots; any other disk is unmounted and
        deleted whole. Never walks the agent's files (subvolumes go by ioctl, ext4 with the image)."""
        if self.is_child:
            remove_child(self.base)
        elif keep_snapshots and self.cow is not None:
            keep_as_pool(self.disk.folder, self.base)
        else:
            disk.remove(self.disk.folder)


def keep_as_pool(folder: Path, base: Path, *, prefix: str = LOCAL_PREFIX) -> None:
    """Keep the mounted btrfs disk of host folder `folder` as a pool: delete the live subvolumes
    (those directly in `base`, the disk's mount point, and the restores' in its `cow.LIVE`),
    keeping only the snapshots, and mark it `KEPT`; then remove the oldest pools of disks named
    `prefix`… beyond `POOL_KEEP_COUNT` (`cap_pools`). A disk the file system refuses to empty is
    removed whole. Never raises."""
    try:
        _delete_subvolumes_in(base / cow.LIVE)
        _delete_subvolumes_in(base)
        (folder / KEPT).write_text(f"{time.time():.6f}")
    except OSError:
        disk.remove(folder)
    cap_pools(POOL_KEEP_COUNT, disk.leftovers(prefix))


def _delete_subvolumes_in(base: Path) -> None:
    """Delete the subvolumes directly in `base` (one ioctl each; never a walk of their files).

    Raises:
        OSError: the file system refused.
    """
    for entry in sorted(base.iterdir()) if base.is_dir() else []:
        if cow.is_subvolume(entry):
            cow.delete_subvolume(entry)


def frozen_paths(source: PoolSnapshot) -> list[tuple[str, Path]]:
    """(sandbox path, frozen subvolume) of each path of the snapshot `source`."""
    paths = (source.frozen / cow.PATHS).read_text().split("\n")
    return [(path, source.frozen / str(index)) for index, path in enumerate(paths)]


def remove_child(base: Path) -> None:
    """Delete a child's folder `base` on a pool (a local or a docker sandbox's): its subvolumes by
    ioctl, then the (then empty) folders.

    Raises:
        OSError: the file system refused to delete a subvolume (the folder is then left).
    """
    if not base.exists():
        return
    _delete_subvolumes_in(base)
    # Only the known depths (live/<n>, snapshots/<name>/<i>): never a walk into the agent's files.
    entries = list((base / cow.LIVE).iterdir()) if (base / cow.LIVE).is_dir() else []
    snapshots = base / cow.SNAPSHOTS
    for folder in snapshots.iterdir() if snapshots.is_dir() else []:
        entries += list(folder.iterdir()) if folder.is_dir() and not folder.is_symlink() else []
    for entry in entries:
        if cow.is_subvolume(entry):
            cow.delete_subvolume(entry)
    shutil.rmtree(base, ignore_errors=True)


def prune_local_disks(config: BaseModel, run_id: str | None = None, *, running: bool = False) -> PruneReport:
    """Unmount and delete the sized file systems (``/tmp/reroll-local-disk-*``) local
    sandboxes of killed controllers left mounted: those whose controller no longer runs, or
    with `run_id` that run's whatever its controller, or with `running` all. A sandbox's
    processes end with its controller's sidecar (`stop` kills any orphan). A kept pool (see the
    module docstring) goes when no child of it runs and it was kept more than `POOL_KEEP_SECONDS`
    ago or its run folder (`RUN_FILE`) is gone, or with `run_id` or `running`. Also removes the
    unpacked task images whose Docker image is gone (`reroll.sandbox.local.imagebuild.prune_unpacked`),
    and frees the host id ranges of killed controllers' sandboxes, killing what still runs under
    them (`reroll.sandbox.local.identity.reclaim_slots`; whatever `run_id` and `running` say: a
    range whose holder lives is never touched).

    Returns:
        ``{"disks": [host folders removed], "unpacked images": [cache folders removed], "id ranges":
        ["<first uid>-<last uid>" freed]}``, each key only when something was removed.
    """
    removed = []
    for leftover in disk.leftovers(LOCAL_PREFIX):
        if run_id is not None and run_id[-24:] not in leftover.name:
            continue
        if run_id is None and not running and in_use(leftover):
            continue
        disk.remove(leftover)
        if not leftover.exists():
            removed.append(str(leftover))
    from reroll.sandbox.local.imagebuild import prune_unpacked  # the docker SDK: not for a fork

    found = {"disks": removed, "unpacked images": prune_unpacked(), "id ranges": reclaim_slots()}
    return {kind: names for kind, names in found.items() if names}


def mark_pool(reference: str, run_dir: Path) -> None:
    """Write `run_dir` (the recording's run folder) into the pool of `reference` (``<pool>:<name>``,
    its sandbox still running) as `RUN_FILE`, unless written already: `prune_local_disks` removes
    the pool once that folder is gone.

    Raises:
        OSError: the pool's folder is not writable.
    """
    marker = Path(reference.rpartition(":")[0]) / RUN_FILE
    if not marker.is_file():
        marker.write_text(str(run_dir.resolve()))


def cap_pools(keep: int, folders: list[Path] | None = None) -> list[Path]:
    """Remove the oldest kept pools beyond the newest `keep` (none with a live child).

    Args:
        keep: how many pools stay.
        folders: the disks' host folders to consider [default: every local disk on this host].

    Returns:
        The host folders removed.
    """
    found = disk.leftovers(LOCAL_PREFIX) if folders is None else folders
    pools = [(_kept_at(folder), folder) for folder in found]
    kept = sorted((at, folder) for at, folder in pools if at is not None)
    removed = []
    for _, folder in kept[: max(len(kept) - keep, 0)]:
        if not _child_runs(folder):
            disk.remove(folder)
            removed.append(folder)
    return removed


def _kept_at(folder: Path) -> float | None:
    """When the disk in `folder` was kept as a pool (seconds since the epoch); None: not a pool."""
    try:
        return float((folder / KEPT).read_text())
    except (OSError, ValueError):
        return None


def _child_runs(folder: Path) -> bool:
    """Whether a child sandbox of the pool in `folder` runs (its controller alive)."""
    children = folder / disk.MOUNTPOINT / CHILDREN
    return children.is_dir() and any(owner_runs(disk.owner(child)) for child in children.iterdir())


def in_use(folder: Path) -> bool:
    """Whether the disk in `folder` is a live rollout's, or a pool with a live child, or kept
    recently by a run folder that still exists."""
    kept = _kept_at(folder)
    if kept is None:
        return owner_runs(disk.owner(folder))
    if _child_runs(folder):
        return True
    try:
        run = Path((folder / RUN_FILE).read_text())
    except OSError:
        run = None
    if run is not None and not run.exists():
        return False  # the run that recorded it was deleted
    return time.time() - kept < POOL_KEEP_SECONDS


def remove_pools_under(folder: Path) -> list[Path]:
    """Remove the kept pools whose run folder (`RUN_FILE`) lies in `folder` and no child of which
    runs (a test session's, at its end): the local sandboxes' and the docker ones'.

    Returns:
        The host folders removed.
    """
    removed = []
    for leftover in disk.leftovers(LOCAL_PREFIX) + disk.leftovers(disk.PREFIX):  # docker's pools too
        try:
            run = Path((leftover / RUN_FILE).read_text())
        except OSError:
            continue
        if run.is_relative_to(folder) and _kept_at(leftover) is not None and not _child_runs(leftover):
            disk.remove(leftover)
            removed.append(leftover)
    return removed


def pool_bytes(source: PoolSnapshot) -> int:
    """The bytes the pool's image file holds on the host (allocated, not its apparent size)."""
    return os.stat(source.pool / disk.IMAGE).st_blocks * 512
