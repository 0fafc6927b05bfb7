"""The docker sandbox's snapshots, restores and pool checkpoints by copy-on-write
(`reroll.sandbox.docker.cowdisk`), where its disk is btrfs; elsewhere, and for paths that are not
its sized folders, the sidecar's tar (`reroll.sandbox.sidecar_client.SidecarClient`).

`CowSnapshots` is the part of `reroll.sandbox.docker.backend.DockerSandbox` that makes the sized
disk (`make_disk`) and overrides `Sandbox.snapshot` and `Sandbox.restore`; it offers what the
checkpoints extension looks for (`reroll.rollout.extensions.checkpoints`): ``pool_snapshot``,
``adopt_pool_snapshot``, ``drop_pool_snapshot`` and ``pool_freeze_plan`` (None: the container's
layer is copied by the controller, so the proxy holds each step and the controller freezes).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from docker.models.containers import Container
from reroll_contracts.errors import SandboxError
from reroll_contracts.proxy import FreezePlan

from reroll.sandbox.base import Sandbox
from reroll.sandbox.docker import disk, layer
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.cowdisk import CowDisk, Folders
from reroll.sandbox.docker.upper import upper_dir
from reroll.sandbox.local import cow
from reroll.sandbox.local.storage import PoolSnapshot


class CowSnapshots(Sandbox):
    """Copy-on-write snapshots for the docker backend (see the module docstring); the backend sets
    `config`, `container`, `_disk` and calls `make_disk`, `give_layer` and `release_disk`."""

    config: DockerSandboxConfig
    container: Container | None
    _disk: disk.SizedDisk | None
    _cow: CowDisk | None = None
    _pooled: bool = False
    """Whether a pool snapshot was taken (``keep_snapshots`` None keeps the disk then)."""

    def make_disk(self, run_id: str, size_bytes: int, folders: Folders, owner: str) -> dict[str, Path]:
        """Make the sandbox's sized disk with `folders`: a child's folder on the pool of
        ``config.from_snapshot``, else btrfs with subvolumes where ``config.copy_on_write`` and
        btrfs-progs is installed, else ext4. Sets ``_disk`` (and ``_cow``).

        Returns:
            Container path → the host folder its volume binds.

        Raises:
            SandboxError: the disk could not be made, or ``from_snapshot`` names no kept snapshot.
        """
        if self.config.from_snapshot is not None:
            source = PoolSnapshot.parse(self.config.from_snapshot)
            if not source.pool.name.startswith(disk.PREFIX):
                raise SandboxError(f"from_snapshot {source}: a pool of another backend's sandbox")
            self._cow = CowDisk.child_of(source, f"{run_id[-24:]}-{secrets.token_hex(4)}", folders, owner)
        elif self.config.copy_on_write and cow.available():
            self._cow = CowDisk.create(run_id, size_bytes, folders, owner)
        if self._cow is not None:
            self._disk = self._cow.disk
            return {path: self._cow.host(name) for path, (name, _) in folders.items()}
        self._disk = disk.SizedDisk.create(run_id, size_bytes, dict(folders.values()), owner)
        return {path: self._disk.mountpoint / name for path, (name, _) in folders.items()}

    def layer_home(self) -> Path:
        """Where the container's own writable layer goes on the sized disk
        (`reroll.sandbox.docker.layer.mount_layer`): the disk's mount point, or with copy-on-write
        this sandbox's folder on it (a child's on a pool: each child's layer its own), where its
        `reroll.sandbox.docker.layer.FOLDER` is made a subvolume first, so that keeping a pool or
        removing a child deletes it by ioctl, never by a walk of the agent's files.

        Raises:
            SandboxError: no disk yet, or the file system refused.
        """
        if self._cow is None:
            if self._disk is None:
                raise SandboxError("the sandbox has no sized disk yet")
            return self._disk.mountpoint
        try:
            cow.create_subvolume(self._cow.base / layer.FOLDER)
        except OSError as exc:
            raise SandboxError(f"the container's layer on the btrfs disk: {exc}") from exc
        return self._cow.base

    def give_layer(self, container: Container) -> None:
        """Copy a child's frozen container layer into the created, unstarted `container`.

        Raises:
            SandboxError: as `CowDisk.give_layer`.
        """
        if self._cow is not None:
            self._cow.give_layer(upper_dir(container))

    def release_disk(self) -> None:
        """At `stop`: keep the disk as a pool (``keep_snapshots``, or None and a pool snapshot was
        taken) or remove it (`CowDisk.release`, `reroll.sandbox.docker.disk.remove`)."""
        if self._cow is not None:
            keep = self.config.keep_snapshots
            self._cow.release(keep_snapshots=bool(keep) or (keep is None and self._pooled))
        elif self._disk is not None:
            disk.remove(self._disk.folder)
        self._cow, self._disk = None, None

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """See `Sandbox.snapshot`: copy-on-write (`reroll.sandbox.docker.cowdisk.CowDisk.snapshot`)
        when the disk is btrfs and `paths` are among its folders, else (or when that fails: a full
        disk has no room for a snapshot's metadata) the sidecar's tar. Returns
        the bytes in use on the disk then (what the snapshot shares with the live folders, at most)."""
        paths = paths or [self.layout.workspace]
        cow_disk = self._cow
        if cow_disk is None or not cow_disk.covers(paths):
            if cow_disk is not None:
                await asyncio.to_thread(cow_disk.forget, name)  # a restore of `name` is now tar's
            return await super().snapshot(name, paths)
        try:
            await asyncio.to_thread(cow_disk.snapshot, name, paths)
        except SandboxError:  # a full disk has no room for the snapshot's metadata: tar's is elsewhere
            return await super().snapshot(name, paths)
        return await asyncio.to_thread(_used_bytes, cow_disk.base)

    async def restore(self, name: str) -> list[str]:
        """See `Sandbox.restore`: a copy-on-write snapshot mounted over its folders in the
        container (`reroll.sandbox.docker.cowdisk.CowDisk.restore`), a tar snapshot by the sidecar."""
        cow_disk = self._cow
        if cow_disk is None or self.container is None or not cow_disk.has(name):
            return await super().restore(name)
        pid = await asyncio.to_thread(_init_pid, self.container)
        return await asyncio.to_thread(cow_disk.restore, name, pid)

    async def pool_snapshot(self, name: str) -> str | None:
        """Freeze the sized folders and copy the container's layer as `name` for a kept pool
        (`CowDisk.freeze`): ``<pool>:<name>``, what ``from_snapshot`` takes after this sandbox
        stops; None with ``keep_snapshots`` False, without copy-on-write, or on a pool's child.

        Raises:
            SandboxError: as `CowDisk.freeze`.
        """
        cow_disk = self._cow
        if self.config.keep_snapshots is False or cow_disk is None or cow_disk.is_child:
            return None
        upper = upper_dir(self.container) if self.container is not None else None
        await asyncio.to_thread(cow_disk.freeze, name, upper)
        self._pooled = True
        return str(PoolSnapshot(cow_disk.disk.folder, name))

    def pool_freeze_plan(self) -> FreezePlan | None:
        """None: the container's layer is the controller's to copy, so the proxy holds each step
        (`reroll.rollout.extensions.checkpoints`)."""
        return None

    def adopt_pool_snapshot(self, name: str) -> str | None:
        """``<pool>:<name>`` of pool snapshot `name` when it exists (the disk is then kept as a
        pool), else None."""
        cow_disk = self._cow
        if cow_disk is None or not cow_disk.has(name):
            return None
        self._pooled = True
        return str(PoolSnapshot(cow_disk.disk.folder, name))

    async def drop_pool_snapshot(self, name: str) -> None:
        """Delete the pool snapshot `name`; nothing when there is none.

        Raises:
            SandboxError: a bad name, or the file system refused.
        """
        if self._cow is not None:
            await asyncio.to_thread(self._cow.forget, name)


def _init_pid(container: Container) -> int:
    """The host pid of `container`'s first process (its mount namespace is the container's).

    Raises:
        SandboxError: the container does not run.
    """
    container.reload()
    pid = int(container.attrs["State"].get("Pid") or 0)
    if pid <= 0:
        raise SandboxError(f"container {container.name} does not run")
    return pid


def _used_bytes(path: Path) -> int:
    """The bytes in use on the file system of `path`."""
    usage = os.statvfs(path)
    return (usage.f_blocks - usage.f_bfree) * usage.f_frsize
