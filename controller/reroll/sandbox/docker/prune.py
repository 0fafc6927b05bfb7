"""``reroll sandbox prune`` for docker: leftover containers, volumes, networks and firewall tables."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from reroll.host.owner import owner_runs
from reroll.sandbox.docker import disk, firewall
from reroll.sandbox.docker.engine import (
    DISK_LABEL,
    MOUNT_POINT,
    OWNER_LABEL,
    RUN_ID_LABEL,
    SHARED_VOLUMES,
    docker_client,
)
from reroll.sandbox.docker.images import MANAGED_LABEL
from reroll.sandbox.docker.networks import FULL_NETWORK, ISOLATED_PREFIX, remove_isolated_network
from reroll.sandbox.local.storage import in_use as pool_in_use


def prune(run_id: str | None = None, *, running: bool = False) -> dict[str, list[str]]:
    """Remove reroll's leftover containers (their controller is gone), their volumes and sized
    file systems (`reroll.sandbox.docker.disk`), unused networks (but never the shared
    `FULL_NETWORK`), and the firewall tables of removed networks (`reroll.sandbox.docker.firewall`;
    reroll's own tables only).

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
    sweep = _Sweep(engine, run_id, spare_live=not (running or run_id))
    try:
        sweep.containers()
        sweep.volumes()
        sweep.networks()
        if run_id is None:  # firewall tables whose network is gone (a controller killed in between)
            sweep.firewall_tables()
    finally:
        engine.close()
    sweep.folders(running)
    return sweep.removed


STARTING_GRACE_SECONDS = 300.0
"""How long a machine-wide prune leaves a new mount folder alone (a rollout's images are built
before it is made, so what follows it, the sized disk and the container, takes seconds)."""


@dataclass
class _Sweep:
    """One `prune`: what it removed, and what the rollouts it spares still use."""

    engine: docker.DockerClient
    run_id: str | None
    spare_live: bool
    """Keep what belongs to a controller that still runs (neither ``running`` nor a run id)."""
    removed: dict[str, list[str]] = field(
        default_factory=lambda: {
            "containers": [],
            "kept": [],
            "volumes": [],
            "networks": [],
            "firewall_tables": [],
        }
    )
    in_use: set[str] = field(default_factory=set)
    """The mount folders (and sized file systems) of the containers kept."""
    volumes_in_use: set[str | None] = field(default_factory=set)

    @property
    def filters(self) -> dict[str, Any]:
        """reroll's objects (of the run id, if one is given)."""
        labels = [f"{MANAGED_LABEL}=1"] + ([f"{RUN_ID_LABEL}={self.run_id}"] if self.run_id else [])
        return {"label": labels}

    def _live(self, labels: dict[str, str] | None) -> bool:
        """Whether an object with `labels` is spared: its controller still runs."""
        return self.spare_live and owner_runs((labels or {}).get(OWNER_LABEL))

    def containers(self) -> None:
        """Remove the containers, keeping live rollouts' (and noting what they use). Only those
        reroll started (they carry a run id): a ``docker build`` step FROM one of reroll's images
        inherits its ``reroll.managed`` label, and belongs to a build that may still run."""
        filters = {"label": [*self.filters["label"], RUN_ID_LABEL]}
        # ignore_removed: a container removed between the listing and its inspection (a rollout
        # ending, another prune) is not an error
        for container in self.engine.containers.list(all=True, filters=filters, ignore_removed=True):
            name = container.name or container.id or ""
            if self._live(container.labels):
                self.removed["kept"].append(name)
                mounts = container.attrs["Mounts"]
                self.in_use.update(m["Source"] for m in mounts if m["Destination"] == MOUNT_POINT)
                self.volumes_in_use.update(m.get("Name") for m in mounts)
                continue
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as error:  # 409: its own run or another prune removes it
                if error.status_code == 409 and "already in progress" in str(error.explanation):
                    continue
                raise
            self.removed["containers"].append(name)

    def volumes(self) -> None:
        """Remove the volumes no kept container uses, but never the shared installs."""
        for volume in self.engine.volumes.list(filters=self.filters):
            if volume.name in SHARED_VOLUMES:
                continue  # installs shared by every rollout, not a leftover
            volume_labels = volume.attrs.get("Labels") or {}
            folder = volume_labels.get(DISK_LABEL)
            if volume.name in self.volumes_in_use or self._live(volume_labels):
                self.in_use.add(str(folder))  # in use, or its rollout is still starting
                continue
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)
                self.removed["volumes"].append(volume.name or "")

    def networks(self) -> None:
        """Remove the networks no live rollout owns or uses (an isolated one with its firewall
        table). The shared `FULL_NETWORK` stays, as the shared volumes do: a rollout starting
        elsewhere may hold its id between finding it and starting its container in it."""
        for network in self.engine.networks.list(filters=self.filters):
            name = network.name or ""
            if name == FULL_NETWORK:
                continue
            if self._live(network.attrs.get("Labels")):
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
                self.removed["networks"].append(name)

    def firewall_tables(self) -> None:
        """Remove reroll's firewall tables whose network is gone."""
        filters = {"label": f"{MANAGED_LABEL}=1"}
        names = {network.name for network in self.engine.networks.list(filters=filters)}
        for key in firewall.tables():
            if ISOLATED_PREFIX + key not in names:
                firewall.remove(key)
                self.removed["firewall_tables"].append(firewall.table_name(key))

    def folders(self, running: bool) -> None:
        """Remove the host's mount folders and sized file systems no kept rollout uses. A machine-
        wide sweep (no run id, not ``running``) spares a mount folder made in the last
        `STARTING_GRACE_SECONDS`: a rollout starting elsewhere makes it before its container,
        which a sweep between the two would find in no container (its sidecar then found no
        token)."""
        run_id = self.run_id
        fresh_after = time.time() - STARTING_GRACE_SECONDS
        for leftover in Path(tempfile.gettempdir()).glob("reroll-docker-*"):
            if str(leftover) in self.in_use or (run_id is not None and run_id[-24:] not in leftover.name):
                continue
            with contextlib.suppress(OSError):
                if run_id is None and not running and leftover.lstat().st_mtime > fresh_after:
                    continue
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in disk.leftovers():
            if str(leftover) in self.in_use or (run_id is not None and run_id[-24:] not in leftover.name):
                continue
            if run_id is None and not running and pool_in_use(leftover):
                continue  # a live rollout's, maybe still without its volumes; a pool kept
            disk.remove(leftover)
