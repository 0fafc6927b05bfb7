"""The docker backend's engine client, and how reroll names and labels what it makes there.

Every container carries `RUN_ID_LABEL` (its rollout) and `OWNER_LABEL` (the controller process
that started it: host, pid, start time), so `reroll.sandbox.docker.prune` can tell a leftover from
a live rollout's container.
"""

from __future__ import annotations

import contextlib
import os
import socket
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
container (the start time tells a reused pid apart)."""


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


def owner_label(pid: int | None = None) -> str:
    """The `OWNER_LABEL` value naming process `pid` (default: this one) on this host."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{_start_ticks(pid)}"


def _start_ticks(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot, clock ticks); "" if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def owner_runs(owner: str | None) -> bool:
    """Whether the controller named by an `OWNER_LABEL` value still runs (another host's: assumed so)."""
    if not owner:
        return False  # no owner label: a container from before labels had owners
    host, _, process = owner.partition("/")
    if host != socket.gethostname():
        return True
    pid, _, ticks = process.partition("/")
    return pid.isdigit() and ticks != "" and _start_ticks(int(pid)) == ticks
