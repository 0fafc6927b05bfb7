"""Copy-on-write snapshots of the isolated `local` sandbox's workspace and HOME: btrfs subvolumes.

Where btrfs-progs is installed (``mkfs.btrfs``; ``scripts/install-sandbox-tools``), the sandbox's
sized file system (`reroll.sandbox.docker.disk`) is btrfs instead of ext4, and its workspace and
HOME are subvolumes of it (`Subvolumes.create`). Then:

- a snapshot is a read-only snapshot of each subvolume, at ``<disk>/snapshots/<name>/<n>``: one
  ioctl each (``BTRFS_IOC_SNAP_CREATE_V2``), sharing every extent with the live tree, so it
  costs milliseconds whatever the workspace holds, and its storage grows with the bytes changed
  since; the sandbox cannot reach it (it is outside the sandbox's root view), and the kernel
  refuses writes to it whoever asks;
- a restore is a writable snapshot of that read-only one, at ``<disk>/live/<n>-<k>``, mounted
  over the folder in the sandbox's mount namespace (`mount_into`: ``open_tree`` on the host,
  then, in a thread with a file-system context of its own that has entered the namespace,
  ``move_mount``), replacing the restore mounted there before, which is then deleted. Only the
  syscalls run, through ctypes (which releases the GIL, unlike ``fcntl.ioctl``): no process is
  started.

A process whose current folder or open files are in the restored folder keeps the tree it had
(the agent's processes are quiesced before a restore); every path opened afterwards, and every
process started afterwards, sees the restored tree.

Where btrfs-progs is missing, the disk stays ext4 and snapshots take the sidecar's tar path
(`reroll_sidecar.snapshots`); so do snapshots of paths other than the workspace and HOME.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.btrfs import (
    PATHS,
    check,
    create_subvolume,
    delete_subvolume,
    freeze,
    is_subvolume,
    libc,
    snapshot_subvolume,
)
from reroll_contracts.errors import SandboxError
from reroll_contracts.namespaces import CLONE_NEWNS
from reroll_contracts.snapshots import NAME_PATTERN

__all__ = ["PATHS", "create_subvolume", "delete_subvolume", "is_subvolume", "snapshot_subvolume"]
"""Re-exported from `reroll_contracts.btrfs`, where the ioctls live (the proxy uses them too)."""

SNAPSHOTS = "snapshots"
"""The folder of the disk holding the read-only snapshots (``<name>/<index>``)."""
LIVE = "live"
"""The folder of the disk holding the writable snapshots mounted by restores."""
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MNT_DETACH = 2
_CLONE_FS = 0x200
_AT_FDCWD = -100
_SYS_OPEN_TREE = 428  # x86_64 and aarch64 alike (the new syscalls share numbers)
_SYS_MOVE_MOUNT = 429
_SYS_OPENAT2 = 437
_RESOLVE_IN_ROOT_NO_SYMLINKS = 0x10 | 0x04


def available() -> bool:
    """Whether the local sandbox's disk is btrfs with subvolumes (``mkfs.btrfs`` on PATH, and the
    kernel knows btrfs)."""
    return shutil.which("mkfs.btrfs") is not None and _kernel_has_btrfs()


@functools.cache
def _kernel_has_btrfs() -> bool:
    try:
        return "btrfs" in Path("/proc/filesystems").read_text().split()
    except OSError:
        return False


def mount_into(pid: int, source: Path, target: str, *, replace: bool) -> None:
    """Mount the host folder `source` at `target` in the mount namespace of process `pid`, as a
    clone of `source`'s mount (its flags: ``nosuid,nodev``); with `replace`, first detach what a
    previous call mounted there (never the sandbox's own, locked mount below it).

    Runs in a thread of its own: ``setns`` into a mount namespace needs a file-system context
    that no other thread shares (``unshare(CLONE_FS)``), and the thread ends with it.

    Raises:
        OSError: a syscall failed (the process is gone, `target` missing in it…).
    """
    c = libc()
    tree = check(
        c.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        f"open_tree {source}",
    )
    failure: list[OSError] = []

    def enter_and_mount() -> None:
        # Both opened before setns: the namespace's own /proc does not show `pid`.
        namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            check(c.unshare(_CLONE_FS), "unshare(CLONE_FS)")
            check(c.setns(namespace, CLONE_NEWNS), f"setns into {pid}'s mount namespace")
            if replace:
                where = _open_in_root(root, target)
                try:
                    os.fchdir(where)
                    check(c.umount2(b".", _MNT_DETACH), f"umount {target}")
                finally:
                    os.close(where)
            where = _open_in_root(root, target)
            try:
                flags = _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH
                check(c.syscall(_SYS_MOVE_MOUNT, tree, b"", where, b"", flags), f"move_mount to {target}")
            finally:
                os.close(where)
        except OSError as exc:
            failure.append(exc)
        finally:
            os.close(root)
            os.close(namespace)

    try:
        thread = threading.Thread(target=enter_and_mount, name=f"reroll-mount-{pid}")
        thread.start()
        thread.join()
    finally:
        os.close(tree)
    if failure:
        raise failure[0]


class _OpenHow(ctypes.Structure):
    """``struct open_how`` of ``openat2``."""

    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _open_in_root(root: int, target: str) -> int:
    """An ``O_PATH`` descriptor of the folder `target` below the descriptor `root` of a sandbox's
    root folder, resolved inside that root and following no symbolic link (the sandbox may have
    planted some on the way): ``openat2`` with ``RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS``.

    Raises:
        OSError: no such folder, or a link on the way (ELOOP).
    """
    how = _OpenHow(flags=os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, resolve=_RESOLVE_IN_ROOT_NO_SYMLINKS)
    relative = os.fsencode(target.lstrip("/") or ".")
    result = libc().syscall(_SYS_OPENAT2, root, relative, ctypes.byref(how), ctypes.sizeof(how))
    return check(result, f"open {target} in the sandbox's root")


@dataclass
class Subvolumes:
    """The subvolumes of one sandbox's btrfs disk, by the sandbox path they are mounted at.

    Args:
        disk: the folder on the sandbox's btrfs file system holding `SNAPSHOTS` and `LIVE` (the
            disk's mount point, or a child's folder of a pool: `reroll.sandbox.local.storage`).
        live: sandbox path → the host subvolume the sandbox sees there now.
    """

    disk: Path
    live: dict[str, Path] = field(default_factory=dict)
    restores: int = 0
    """How many restores were mounted (names the writable snapshots)."""

    @classmethod
    def create(cls, disk: Path, folders: dict[str, Path], *, existing: bool = False) -> Subvolumes:
        """Make a subvolume at each host path of `folders` (sandbox path → host path below `disk`,
        absent; its parents made; with `existing`, they are subvolumes already) and the snapshot
        folders.

        Raises:
            SandboxError: the file system refused (not btrfs).
        """
        try:
            for host in folders.values():
                if not existing:
                    host.parent.mkdir(parents=True, exist_ok=True)
                    create_subvolume(host)
            for name in (SNAPSHOTS, LIVE):
                (disk / name).mkdir(mode=0o700)
        except OSError as exc:
            raise SandboxError(f"the sandbox's btrfs disk {disk}: {exc}") from exc
        return cls(disk, dict(folders))

    def covers(self, paths: list[str]) -> bool:
        """Whether a snapshot of `paths` (sandbox paths) can be copy-on-write: each is one of the
        subvolumes' paths, none twice."""
        return bool(paths) and set(paths) <= self.live.keys() and len(set(paths)) == len(paths)

    def snapshot(self, name: str, paths: list[str]) -> int:
        """Take read-only snapshots of the subvolumes at `paths` as snapshot `name` (replacing one
        of that name).

        Returns:
            The bytes in use on the disk: what the snapshot shares with the live tree, at most
            (it holds no bytes of its own until the live tree changes).

        Raises:
            SandboxError: a bad name, a path that is no subvolume, or the file system refused.
        """
        return self.freeze(name, paths, None)

    def freeze(self, name: str, paths: list[str], root: Path | None) -> int:
        """`snapshot`, with the subvolume `root` (the sandbox's ``/``) frozen too when given
        (`reroll_contracts.btrfs.freeze`)."""
        folder = self._snapshot_folder(name)
        try:
            self._drop(folder)
            freeze(folder, [self.live[path] for path in paths], paths, root)
            usage = os.statvfs(self.disk)
        except (OSError, KeyError) as exc:
            raise SandboxError(f"copy-on-write snapshot {name!r}: {exc}") from exc
        return (usage.f_blocks - usage.f_bfree) * usage.f_frsize

    def forget(self, name: str) -> None:
        """Delete copy-on-write snapshot `name` if there is one (a tar snapshot of that name replaces it).

        Raises:
            SandboxError: a bad name, or the file system refused.
        """
        forget_snapshot(self.disk / SNAPSHOTS, name)

    def has(self, name: str) -> bool:
        """Whether a copy-on-write snapshot `name` exists."""
        return has_snapshot(self.disk / SNAPSHOTS, name)

    def restore(self, name: str, pid: int) -> list[str]:
        """Mount a writable snapshot of each of snapshot `name`'s subvolumes over its path in the
        mount namespace of process `pid` (the sandbox's PID 1), and delete the restores they
        replace.

        Returns:
            The sandbox paths restored (as given to `snapshot`).

        Raises:
            SandboxError: no such snapshot, or the file system or a mount failed.
        """
        folder = self._snapshot_folder(name)
        try:
            paths = (folder / PATHS).read_text().split("\n")
        except OSError as exc:
            raise SandboxError(f"no snapshot named {name!r}") from exc
        try:
            for index, path in enumerate(paths):
                self.restores += 1
                fresh = self.disk / LIVE / f"{self.restores}"
                snapshot_subvolume(folder / str(index), fresh, readonly=False)
                old = self.live[path]
                mount_into(pid, fresh, path, replace=old.parent == self.disk / LIVE)
                self.live[path] = fresh
                if old.parent == self.disk / LIVE:
                    delete_subvolume(old)
        except OSError as exc:
            raise SandboxError(f"restore of copy-on-write snapshot {name!r}: {exc}") from exc
        return paths

    def _snapshot_folder(self, name: str) -> Path:
        """Snapshot `name`'s folder. Raises SandboxError for a name not matching `NAME_PATTERN`."""
        return snapshot_folder(self.disk / SNAPSHOTS, name)

    def _drop(self, folder: Path) -> None:
        """Delete snapshot `folder` (its subvolumes, then it) if it exists."""
        drop_snapshot(folder)


def snapshot_folder(snapshots: Path, name: str) -> Path:
    """The folder of snapshot `name` in the folder `snapshots` (a disk's `SNAPSHOTS`).

    Raises:
        SandboxError: `name` does not match `NAME_PATTERN`.
    """
    if not NAME_PATTERN.match(name):
        raise SandboxError(f"snapshot name {name!r} must match {NAME_PATTERN.pattern}")
    return snapshots / name


def has_snapshot(snapshots: Path, name: str) -> bool:
    """Whether the folder `snapshots` holds a copy-on-write snapshot `name` (its `PATHS` written)."""
    return NAME_PATTERN.match(name) is not None and (snapshots / name / PATHS).is_file()


def forget_snapshot(snapshots: Path, name: str) -> None:
    """Delete snapshot `name` of the folder `snapshots` if there is one.

    Raises:
        SandboxError: a bad name, or the file system refused.
    """
    try:
        drop_snapshot(snapshot_folder(snapshots, name))
    except OSError as exc:
        raise SandboxError(f"copy-on-write snapshot {name!r}: {exc}") from exc


def drop_snapshot(folder: Path) -> None:
    """Delete the snapshot `folder` (its subvolumes by ioctl, then its files) if it exists.

    Raises:
        OSError: the file system refused.
    """
    if not folder.exists():
        return
    for entry in folder.iterdir():
        if is_subvolume(entry):
            delete_subvolume(entry)
    shutil.rmtree(folder)
