"""A sized file system for a sandbox's writable folders (its disk quota): docker's, and the
isolated `local` sandbox's (`reroll.sandbox.local.isolated`, under `LOCAL_PREFIX`).

Docker's storage driver here (fuse-overlayfs) has no ``--storage-opt size``, and the workspace
is a volume of the host's file system, so an agent could fill the host's disk (issue 12, item
4). Each sandbox therefore gets a sparse file of the task's ``storage_mb`` holding an ext4 file
system (no journal, no reserved blocks), loop-mounted on the host (``nosuid,nodev``, ``discard``
so deleted files give their blocks back) and handed to the container as volumes: the workspace
and ``/tmp`` share it. Writing beyond it fails with ENOSPC in the sandbox; the host's file grows
to at most the quota. The cost: ``mkfs.ext4``, ``mount`` and ``umount`` of a sparse file, about
0.2 s a rollout (``scripts/bench/sandbox_isolation.py``); mounting needs root.

The isolated `local` sandbox asks for btrfs instead where btrfs-progs is installed
(`reroll.sandbox.local.cow`: its workspace and HOME are subvolumes, snapshotted copy-on-write);
below `MIXED_BELOW_BYTES` in btrfs's mixed mode (data and metadata in the same block groups),
which small file systems need. btrfs is mounted ``discard=async,nobarrier,noatime``: a snapshot
commits a transaction, which then waits on no cache flush and no synchronous discard (the disk
is the sandbox's, gone with a host crash either way), and reads dirty no metadata; freed blocks
still go back to the host, a moment later.

Root-side safety: the host never walks the agent's files in it — `remove` unmounts the file
system (lazily, should a process still hold it) and deletes the image file as a whole.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from reroll_contracts.errors import SandboxError

if TYPE_CHECKING:  # the docker SDK is loaded by the one function that talks to the engine: a local
    import docker  # rollout imports this module (PREFIX) and never the SDK (tests/jobs/test_branch.py)

PREFIX = "reroll-disk-"
LOCAL_PREFIX = "reroll-local-disk-"
"""The local sandboxes' (`reroll.sandbox.local.isolated`), which docker's prune leaves alone."""
"""Host folders of these file systems are ``<tmp>/reroll-disk-<run id>-<random>``."""
IMAGE = "disk.img"
MOUNTPOINT = "mnt"
OWNER = "owner"
"""A file in the host folder naming the process that made it (`reroll.host.owner.owner_label`)."""
FULL_BELOW_BYTES = 1 << 20
"""A file system with less than this free counts as full (`SizedDisk.full`)."""
BTRFS_FULL_BELOW_BYTES = 4 << 20
"""The same for btrfs, which refuses writes with a few MiB still reported available (its global
reserve for metadata: about 1.5 MiB free when a 64 MiB disk is full)."""
MIXED_BELOW_BYTES = 1 << 30
"""A btrfs file system smaller than this is made with ``--mixed`` (btrfs refuses below ~110 MiB
without it, and wastes space below 1 GiB)."""
_TIMEOUT_SECONDS = 60.0


def _run(argv: list[str]) -> None:
    """Run a file-system tool on the host.

    Raises:
        SandboxError: it is missing, failed (its message quoted) or hung.
    """
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the sandbox's disk quota: {argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        hint = " (mounting the sandbox's sized file system needs root)" if os.geteuid() != 0 else ""
        raise SandboxError(f"the sandbox's disk quota: {' '.join(argv)} failed{hint}: {done.stderr.strip()}")


@dataclass(frozen=True)
class SizedDisk:
    """A mounted file system of a fixed size; see the module docstring."""

    folder: Path
    """The host folder holding the image file and the mount point."""
    size_bytes: int
    filesystem: Literal["ext4", "btrfs"] = "ext4"

    @property
    def mountpoint(self) -> Path:
        return self.folder / MOUNTPOINT

    @classmethod
    def create(
        cls,
        run_id: str,
        size_bytes: int,
        subfolders: dict[str, int],
        owner: str,
        prefix: str = PREFIX,
        filesystem: Literal["ext4", "btrfs"] = "ext4",
    ) -> SizedDisk:
        """Make and mount a `filesystem` of `size_bytes`, with `subfolders` (name → mode) in it, in a
        host folder named `prefix` + the end of `run_id`; `owner` (who makes it) is written beside
        it, for `owner` to read back.

        Raises:
            SandboxError: a tool failed (not root, no loop device); nothing is left behind.
        """
        folder = Path(tempfile.mkdtemp(prefix=f"{prefix}{run_id[-24:]}-"))
        disk = cls(folder, size_bytes, filesystem)
        try:
            folder.chmod(0o700)
            (folder / OWNER).write_text(owner)
            image = folder / IMAGE
            with open(image, "wb") as handle:
                handle.truncate(size_bytes)
            _run(_mkfs(filesystem, size_bytes, image))
            disk.mountpoint.mkdir()
            options = "loop,nosuid,nodev," + (
                "discard=async,nobarrier,noatime" if filesystem == "btrfs" else "discard"
            )
            _run(["mount", "-o", options, str(image), str(disk.mountpoint)])
            for name, mode in subfolders.items():
                (disk.mountpoint / name).mkdir()
                (disk.mountpoint / name).chmod(mode)
        except BaseException:
            remove(folder)
            raise
        return disk

    def full(self) -> bool:
        """Whether less than `FULL_BELOW_BYTES` (btrfs: `BTRFS_FULL_BELOW_BYTES`) is free (the
        sandbox's writes hit the quota)."""
        stat = os.statvfs(self.mountpoint)
        below = BTRFS_FULL_BELOW_BYTES if self.filesystem == "btrfs" else FULL_BELOW_BYTES
        return stat.f_bavail * stat.f_frsize < below


def _mkfs(filesystem: str, size_bytes: int, image: Path) -> list[str]:
    """The command making `filesystem` in the file `image` of `size_bytes`."""
    if filesystem == "btrfs":
        return [
            "mkfs.btrfs",
            "-q",
            "-f",
            "--nodiscard",
            *(["--mixed"] if size_bytes < MIXED_BELOW_BYTES else []),
            str(image),
        ]
    return ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard", str(image)]


def remove(folder: Path) -> None:
    """Unmount the file system in `folder` (if mounted) and delete the folder; never raises."""
    mountpoint = folder / MOUNTPOINT
    unmount = ["umount", str(mountpoint)]
    if os.path.ismount(mountpoint) and subprocess.run(unmount, capture_output=True, check=False).returncode:
        subprocess.run(["umount", "--lazy", str(mountpoint)], capture_output=True, check=False)
    if not os.path.ismount(mountpoint):
        shutil.rmtree(folder, ignore_errors=True)


def owner(folder: Path) -> str:
    """The owner written by `SizedDisk.create` into `folder`; "" when there is none."""
    try:
        return (folder / OWNER).read_text()
    except OSError:
        return ""


def leftovers(prefix: str = PREFIX) -> list[Path]:
    """The host folders of sized file systems named `prefix`… on this host (live sandboxes' and
    leftovers)."""
    return sorted(Path(tempfile.gettempdir()).glob(f"{prefix}*"))


def bind_volumes(
    engine: docker.DockerClient, binds: dict[str, Path], labels: dict[str, str], made: list[str]
) -> None:
    """Create a local volume per item of `binds` (name → the host folder it binds), labelled
    `labels`, at once (one engine round trip each: a sandbox's start waits for the slowest, not
    the sum); each name made is appended to `made` (for the caller's cleanup, whatever failed).

    Raises:
        SandboxError: the engine refused one (the first error).
    """
    import docker.errors

    def create(name: str) -> None:
        options = {"type": "none", "o": "bind", "device": str(binds[name])}
        try:
            engine.volumes.create(name, driver="local", driver_opts=options, labels=labels)
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot create the docker volume {name}: {exc}") from exc
        made.append(name)

    with concurrent.futures.ThreadPoolExecutor(max(1, len(binds))) as pool:
        for created in [pool.submit(create, name) for name in binds]:
            created.result()
