"""The container's own writable layer on the sandbox's sized file system (issue 32).

The sized file system (`reroll.sandbox.docker.disk`) holds the workspace, the logs, the homes and
the temporary folders; what an agent writes anywhere else (``/usr/local``, ``/opt``, ``/var``;
anything, for an agent running as root) lands in the container's own writable layer, the storage
driver's *upper* folder on the host's disk. The driver here (fuse-overlayfs) has no
``--storage-opt size``, so that layer was not counted against ``storage_mb``.

Now `mount_layer` moves it onto the same sized file system, between creating the container and
starting it: the layer's folder (``<docker root>/<driver>/<id>``, holding ``diff`` — the upper
folder — ``work``, ``merged`` and the driver's small ``link``/``lower`` files, all the daemon's,
none yet the agent's) is copied into `FOLDER` there and that copy is bind-mounted over it, so the
overlay mounted at start has its upper and work folders (one file system, as overlayfs wants) on
the sandbox's quota. Every writable path of the container then shares one ``storage_mb``, and a
write past it fails with ENOSPC, in the kernel, with no polling window; `SizedDisk.full` tells it.
`FOLDER` is beside the volumes' folders, never inside one, so no path of the container reaches it.

`release` undoes it before the container is removed: the container is killed (the daemon unmounts
its overlay), then the bind mount is unmounted, so the daemon's removal deletes only its own
empty folder, never walking the agent's files. A controller killed in between leaves the bind
mount; ``docker rm -f`` (`reroll.sandbox.docker.prune`) still removes it, the daemon unmounting a
busy folder before deleting it.

Root-side safety: the host touches only the daemon's paths (read from ``docker inspect`` before the
agent's first process exists) and never follows or walks anything the agent wrote.

Cost: a copy of five small entries and one ``mount --bind`` at start, one ``umount`` at stop;
start + stop within noise of before (``scripts/bench/sandbox_isolation --layer``, figures in
``docs/sandboxes.md``).

Drivers without an upper folder (``btrfs``, ``zfs``, ``vfs``, a remote engine) keep the layer
uncounted; `mount_layer` logs a warning then.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from pathlib import Path

import docker.errors
from docker.models.containers import Container
from reroll_contracts.errors import SandboxError

FOLDER = "layer"
"""The folder of the sized file system holding the container's layer (beside the volumes')."""
_TIMEOUT_SECONDS = 30.0
log = logging.getLogger(__name__)


def layer_folder(container: Container) -> Path | None:
    """The host folder of `container`'s writable layer (the parent of the storage driver's
    ``UpperDir``), from the attributes of its creation; None when the driver names none."""
    upper = ((container.attrs.get("GraphDriver") or {}).get("Data") or {}).get("UpperDir") or ""
    if not upper or not os.path.isabs(upper) or os.path.basename(upper) != "diff":
        return None
    folder = Path(upper).parent
    return folder if folder.is_dir() and not folder.is_symlink() else None


def mount_layer(container: Container, disk_mountpoint: Path) -> Path | None:
    """Put `container`'s writable layer on the sized file system mounted at `disk_mountpoint`;
    call it after creating the container and before starting it.

    Returns:
        The layer's host folder, now a mount point (give it to `release`); None when the storage
        driver names no upper folder (the layer stays uncounted, a warning is logged).

    Raises:
        SandboxError: the copy or the bind mount failed (not root, the engine's files not local).
    """
    folder = layer_folder(container)
    if folder is None:
        driver = (container.attrs.get("GraphDriver") or {}).get("Name", "?")
        log.warning("storage driver %s has no upper folder: the container's layer is not counted", driver)
        return None
    copy = disk_mountpoint / FOLDER
    steps = (
        ["cp", "-a", "--no-dereference", "-T", str(folder), str(copy)],
        ["mount", "--bind", str(copy), str(folder)],
    )
    try:
        for argv in steps:
            subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS, check=True)
    except subprocess.CalledProcessError as exc:
        what = f"{' '.join(exc.cmd)} failed: {exc.stderr.strip()}"
        raise SandboxError(f"the container's layer on the sized disk: {what}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"the container's layer on the sized disk: {exc}") from exc
    return folder


def release(container: Container, folder: Path, *, wait_seconds: float = 10.0) -> None:
    """Kill `container` and unmount its layer `folder` (`mount_layer`), before the container is
    removed; lazily when the folder is still busy. Never raises."""
    with contextlib.suppress(docker.errors.APIError):
        container.kill()
    with contextlib.suppress(docker.errors.APIError, OSError, ValueError):
        container.wait(timeout=wait_seconds)
    if not os.path.ismount(folder):
        return
    for lazy in ((), ("--lazy",)):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(
                ["umount", *lazy, str(folder)], capture_output=True, timeout=_TIMEOUT_SECONDS
            )
            if done.returncode == 0:
                return
