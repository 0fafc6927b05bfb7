"""``reroll sandbox prune`` for docker: leftover containers, volumes, networks and firewall tables."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import docker
import docker.errors

from reroll.sandbox.docker import disk, firewall
from reroll.sandbox.docker.engine import (
    DISK_LABEL,
    MOUNT_POINT,
    OWNER_LABEL,
    RUN_ID_LABEL,
    SHARED_VOLUMES,
    docker_client,
    owner_runs,
)
from reroll.sandbox.docker.images import MANAGED_LABEL
from reroll.sandbox.docker.networks import ISOLATED_PREFIX, remove_isolated_network


def prune(run_id: str | None = None, *, running: bool = False) -> dict[str, list[str]]:
    """Remove reroll's leftover containers (their controller is gone), their volumes and sized
    file systems (`reroll.sandbox.docker.disk`), unused networks, and the firewall tables of removed
    networks (`reroll.sandbox.docker.firewall`; reroll's own tables only).

    Args:
        run_id: only this run's containers, whether its controller runs or not.
        running: also the containers of rollouts whose controller still runs.

    Returns:
        ``{"containers": [names removed], "kept": [names of live rollouts' containers kept],
        "volumes": [names removed], "networks": [names removed], "firewall_tables": [nftables
        tables removed]}``; the sized file systems of removed volumes are unmounted and deleted.

    Raises:
        SandboxError: no Docker Engine answers, or nft failed.
    """
    engine = docker_client()
    removed: dict[str, list[str]] = {
        "containers": [],
        "kept": [],
        "volumes": [],
        "networks": [],
        "firewall_tables": [],
    }
    in_use: set[str] = set()  # the mount folders (and sized file systems) of the containers kept
    volumes_in_use: set[str | None] = set()
    labels = [f"{MANAGED_LABEL}=1"] + ([f"{RUN_ID_LABEL}={run_id}"] if run_id else [])
    filters: dict[str, Any] = {"label": labels}
    try:
        for container in engine.containers.list(all=True, filters=filters):
            name = container.name or container.id or ""
            if not (running or run_id) and owner_runs(container.labels.get(OWNER_LABEL)):
                removed["kept"].append(name)
                in_use.update(
                    m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == MOUNT_POINT
                )
                volumes_in_use.update(m.get("Name") for m in container.attrs["Mounts"])
                continue
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                removed["containers"].append(name)
        for volume in engine.volumes.list(filters={"label": labels}):
            if volume.name in SHARED_VOLUMES:
                continue  # installs shared by every rollout, not a leftover
            volume_labels = volume.attrs.get("Labels") or {}
            folder = volume_labels.get(DISK_LABEL)
            live = not (running or run_id) and owner_runs(volume_labels.get(OWNER_LABEL))
            if volume.name in volumes_in_use or live:  # in use, or its rollout is still starting
                in_use.add(str(folder))
                continue
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)
                removed["volumes"].append(volume.name or "")
        for network in engine.networks.list(filters={"label": labels}):
            name = network.name or ""
            if not (running or run_id) and owner_runs((network.attrs.get("Labels") or {}).get(OWNER_LABEL)):
                continue  # a live rollout's own network, maybe still without its container
            if name.startswith(ISOLATED_PREFIX):
                removed_network = remove_isolated_network(network)
            else:
                removed_network = True
                try:
                    network.remove()
                except docker.errors.APIError:  # still in use by a live run
                    removed_network = False
            if removed_network:
                removed["networks"].append(name)
        if run_id is None:  # firewall tables whose network is gone (a controller killed in between)
            names = {
                network.name for network in engine.networks.list(filters={"label": f"{MANAGED_LABEL}=1"})
            }
            for key in firewall.tables():
                if ISOLATED_PREFIX + key not in names:
                    firewall.remove(key)
                    removed["firewall_tables"].append(firewall.table_name(key))
    finally:
        engine.close()
    for leftover in Path(tempfile.gettempdir()).glob("reroll-docker-*"):
        if str(leftover) not in in_use and (run_id is None or run_id[-24:] in leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)
    for leftover in disk.leftovers():
        if str(leftover) in in_use or (run_id is not None and run_id[-24:] not in leftover.name):
            continue
        if run_id is None and not running and owner_runs(disk.owner(leftover)):
            continue  # a live rollout's, maybe still without its volumes
        disk.remove(leftover)
    return removed
