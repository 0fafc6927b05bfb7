"""The docker backend's engine client, and how reroll names and labels what it makes there.

Every container carries `RUN_ID_LABEL` (its rollout) and `OWNER_LABEL` (the controller process
that started it: host, pid, start time), so `reroll.sandbox.docker.prune` can tell a leftover from
a live rollout's container.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import docker
import docker.errors
import requests
from reroll_contracts.errors import SandboxError

RUN_ID_LABEL = "reroll.run_id"
MOUNT_POINT = "/run/reroll"
"""Where the sidecar's socket folder (a volume of the rollout's) is mounted in its container."""


OWNER_LABEL = "reroll.owner"
"""``<host name>/<pid>/<start time in clock ticks>`` of the controller process that started the
container (`reroll.host.owner.owner_label`)."""


AGENTS_VOLUME = "reroll-agents"


MANIFESTS_VOLUME = "reroll-agents-manifests"
"""The manifests of the installs in `AGENTS_VOLUME` (`reroll.installs.store`); mounted in no container."""


SHARED_VOLUMES = frozenset({AGENTS_VOLUME, MANIFESTS_VOLUME})
"""Volumes `prune` keeps: the shared installs and their manifests."""


SHARED_LABEL = "reroll.shared"
"""Label of `MANIFESTS_VOLUME` (instead of ``reroll.managed``, which `prune` looks at)."""


ROLE_LABEL = "reroll.role"
"""``rollout``, or ``install`` for an install container (`DockerSandbox.installer`)."""


DISK_LABEL = "reroll.disk"
"""Label of a volume on a sized file system: the host folder of that file system
(`reroll.sandbox.docker.disk`)."""


def docker_client() -> docker.DockerClient:
    """A client of the local Docker Engine (``DOCKER_HOST`` and friends honoured).

    Raises:
        SandboxError: no engine answers.
    """
    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot reach the Docker Engine: {exc}") from exc


def docker_unreachable() -> str:
    """Why the Docker Engine cannot be reached here ("" when it answers)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        return f"Docker is not reachable (no socket {host.removeprefix('unix://')})"
    try:
        with contextlib.closing(docker.from_env()) as client:
            client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        return f"Docker is not reachable ({str(exc)[:200]})"
    return ""
