"""The docker backend's shared installs (`reroll.installs.store`): the volumes `AGENTS_VOLUME`
and `MANIFESTS_VOLUME`, read at their host folders.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import docker.errors
from reroll_contracts.errors import SandboxError

from reroll.sandbox.docker.engine import AGENTS_VOLUME, MANIFESTS_VOLUME, SHARED_LABEL
from reroll.sandbox.docker.images import MANAGED_LABEL
from reroll.sandbox.seam import InstallFolders


def install_store(engine: docker.DockerClient) -> InstallFolders:
    """The docker backend's shared installs: `AGENTS_VOLUME` and `MANIFESTS_VOLUME` at their host
    folders, each made when missing.

    Raises:
        SandboxError: a volume cannot be made, or its folder is not readable here (a remote
            engine, or a controller that is not root).
    """
    return InstallFolders(
        folder=_volume_folder(engine, AGENTS_VOLUME, {MANAGED_LABEL: "1"}),
        # Not labelled managed: the prune of older reroll versions removes such volumes when unused.
        manifests=_volume_folder(engine, MANIFESTS_VOLUME, {SHARED_LABEL: "install-manifests"}),
    )


def _volume_folder(engine: docker.DockerClient, name: str, labels: dict[str, str]) -> Path:
    """The host folder of the named volume `name` (made with `labels` when missing).

    Raises:
        SandboxError: the volume cannot be made, or its folder is not readable here.
    """
    try:
        try:
            volume = engine.volumes.get(name)
        except docker.errors.NotFound:
            volume = engine.volumes.create(name, driver="local", labels=labels)
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot make the docker volume {name}: {exc}") from exc
    folder = Path(volume.attrs.get("Mountpoint") or "")
    if not folder.is_absolute() or not os.access(folder, os.R_OK | os.X_OK):
        raise SandboxError(
            f"the docker volume {name} is at {folder or '?'} on the engine's host, which this process "
            "cannot read: the docker backend needs a local engine and a controller that is root"
        )
    return folder
