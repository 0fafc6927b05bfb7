"""The `docker` sandbox backend: one container per rollout, its sidecar as the entrypoint.

The container runs the task's image as it is (see `reroll.sandbox.images`; built on first use,
no registry needed) with the sidecar as its main process: the self-contained sidecar bundle
(`reroll.sandbox.sidecar_bundle`, built once per machine) is mounted read-only at
``/opt/reroll-sidecar``, so the image needs neither Python nor any tool of reroll's. The
controller reaches the sidecar over a Unix socket in a host folder bind-mounted at
``/run/reroll`` (mode 0700, root only, so the agent cannot reach it; the token file lies
beside it) — a socket works under every network policy, where a published port does not on an
internal network.

Network policy (the task's ``environment.network``): ``full`` joins the bridge network
``reroll-full``; ``none`` joins ``reroll-none-isolated``, an *internal* bridge with no route out
and inter-container traffic off (``enable_icc=false``: concurrent rollouts do not reach each
other), where the only host address reachable is the bridge's gateway — that is where the LLM
proxy listens (`host_address`). Installing an agent needs PyPI, so `egress` lends
``reroll-full`` for the install only. Not filtered yet: other services of the host listening on that
gateway address (or on all addresses) are reachable too; only a firewall rule in the container's
network namespace or on the host would stop them (issue 12, item 3).

Limits (the task's ``environment``): ``cpus``, ``memory_mb`` (swap included) and ``pids_max``.
The workspace's disk use is not capped: the engine's storage driver here (fuse-overlayfs) has no
size option, and the workspace is an anonymous volume of the host's file system.

The agent runs as the unprivileged user ``agent`` (created when the image lacks it); agents
are installed once into the shared volume ``reroll-agents``. Every container carries the labels
``reroll.managed=1``, ``reroll.run_id=<run id>`` and ``reroll.owner`` (the controller process
that started it); `stop` removes it, and `prune` sweeps what killed controllers left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import Mount
from pydantic import BaseModel, ConfigDict, Field

from reroll.config import host_ca_bundle
from reroll.errors import SandboxError, SidecarError
from reroll.sandbox.base import SANDBOX_HOSTNAME, SandboxLayout
from reroll.sandbox.images import IMAGE_MAP_ENV, MANAGED_LABEL, ensure_images, parse_image_map, task_image
from reroll.sandbox.sidecar_bundle import ENTRYPOINT, MOUNT_DIR, ensure_bundle
from reroll.sandbox.sidecar_sandbox import SidecarSandbox
from reroll.tasks import Task

RUN_ID_LABEL = "reroll.run_id"
OWNER_LABEL = "reroll.owner"
"""``<host name>/<pid>/<start time in clock ticks>`` of the controller process that started the
container (the start time tells a reused pid apart)."""
AGENT_USER = "agent"
AGENTS_VOLUME = "reroll-agents"
AGENTS_DIR = "/opt/reroll-agents"
MOUNT_POINT = "/run/reroll"
HOST_CA_PATH = "/etc/reroll/host-ca.pem"
STATE_DIR = "/var/lib/reroll-sidecar"
"""The sidecar's private folder (its default ``--state-dir``): snapshots."""
NETWORKS = {"none": "reroll-none-isolated", "full": "reroll-full"}
"""Network policy → the reroll-managed bridge network the container joins."""
ICC_OPTION = "com.docker.network.bridge.enable_icc"
"""Bridge option: whether containers on the network reach each other (off for ``none``)."""

# Runs once in every new container, as root: the agent's user, folders and ownership. POSIX sh
# with useradd (Debian), adduser (Alpine, busybox) or neither (a bare busybox image: the passwd
# and group entries are written, uid and gid the first free from 1000; root's too when missing).
_SETUP_SCRIPT = f"""
set -e
grep -q "^root:" /etc/passwd 2>/dev/null || echo "root:x:0:0:root:/root:/bin/sh" >>/etc/passwd
grep -q "^root:" /etc/group 2>/dev/null || echo "root:x:0:" >>/etc/group
if ! id -u {AGENT_USER} >/dev/null 2>&1; then
  if command -v useradd >/dev/null 2>&1; then useradd --create-home --shell /bin/sh {AGENT_USER}
  elif command -v adduser >/dev/null 2>&1; then adduser -D -s /bin/sh {AGENT_USER}
  else
    n=1000
    while cut -d: -f3 /etc/passwd /etc/group 2>/dev/null | grep -qx "$n"; do n=$((n + 1)); done
    echo "{AGENT_USER}:x:$n:$n::/home/{AGENT_USER}:/bin/sh" >>/etc/passwd
    echo "{AGENT_USER}:x:$n:" >>/etc/group
    mkdir -p /home/{AGENT_USER}
  fi
fi
home=$(grep "^{AGENT_USER}:" /etc/passwd | cut -d: -f6)
mkdir -p /app /logs/agent /logs/verifier {AGENTS_DIR} "$home"
chown -R "{AGENT_USER}:$(id -g {AGENT_USER})" /app /logs/agent "$home"
"""


def docker_client() -> docker.DockerClient:
    """A client of the local Docker Engine (``DOCKER_HOST`` and friends honoured).

    Raises:
        SandboxError: no engine answers.
    """
    try:
        return docker.from_env()
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot reach the Docker Engine: {exc}") from exc


def ensure_network(client: docker.DockerClient, policy: str) -> Network:
    """The reroll network for `policy` (``none``: internal, ``full``), created when missing.

    Raises:
        SandboxError: unknown policy, or the network cannot be created.
    """
    try:
        name = NETWORKS[policy]
    except KeyError:
        raise SandboxError(f"unknown network policy {policy!r}; known: {', '.join(NETWORKS)}") from None
    with contextlib.suppress(docker.errors.NotFound):
        return client.networks.get(name)
    # Keep the engine's MTU (the default bridge's), which custom networks would not inherit.
    bridge_options = client.networks.get("bridge").attrs.get("Options") or {}
    mtu_key = "com.docker.network.driver.mtu"
    options = {mtu_key: bridge_options[mtu_key]} if mtu_key in bridge_options else {}
    if policy == "none":  # rollouts on it do not reach each other
        options[ICC_OPTION] = "false"
    try:
        return client.networks.create(
            name, driver="bridge", internal=policy == "none", labels={MANAGED_LABEL: "1"}, options=options
        )
    except docker.errors.APIError as exc:
        with contextlib.suppress(docker.errors.NotFound):
            return client.networks.get(name)  # created by a concurrent rollout meanwhile
        raise SandboxError(f"cannot create the docker network {name}: {exc}") from exc


def gateway(network: Network) -> str:
    """The host's address on `network` (its bridge's gateway).

    Raises:
        SandboxError: the network has no IPv4 gateway.
    """
    network.reload()
    for config in network.attrs.get("IPAM", {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
    raise SandboxError(f"docker network {network.name} has no gateway address")


class DockerSandboxConfig(BaseModel):
    """Settings of the `docker` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_timeout_seconds: float = 60.0
    """How long `start` waits for the container's sidecar to answer ready."""
    image: str | None = None
    """Run this image (a local tag) instead of the task's; its Dockerfile is then not built."""
    image_map: dict[str, str] = Field(
        default_factory=lambda: parse_image_map(os.environ.get(IMAGE_MAP_ENV, ""))
    )
    """Source image → local replacement, applied to the FROM lines of a task's Dockerfile before
    it is built [default: ``$REROLL_IMAGE_MAP``, which ``--image-map`` sets]."""
    setup_timeout_seconds: float = 60.0
    """How long the one-time setup in a new container (agent user, folders) may take."""


class DockerSandbox(SidecarSandbox):
    """A sandbox in a Docker container; see the module docstring.

    Args:
        task: the task; its ``environment/Dockerfile`` (if any) and ``environment`` section
            (cpus, memory_mb, network) shape the container.
        run_id: the rollout's id, the container's ``reroll.run_id`` label and part of its name.
        config: the backend's settings; default: `DockerSandboxConfig()`.
    """

    def __init__(self, task: Task, run_id: str, config: DockerSandboxConfig | None = None) -> None:
        self.task = task
        self.run_id = run_id
        self.config = config or DockerSandboxConfig()
        self.policy = task.spec.environment.network
        layout = SandboxLayout(
            root="/",
            workspace="/app",
            logs_dir="/logs",
            home=f"/home/{AGENT_USER}",
            agents_dir=AGENTS_DIR,
            agent_user=AGENT_USER,
        )
        super().__init__(layout, f"docker sandbox {run_id}")
        self.container: Container | None = None
        self._docker: docker.DockerClient | None = None
        self._mount_dir: Path | None = None
        self._token = ""

    @property
    def _engine(self) -> docker.DockerClient:
        if self._docker is None:
            self._docker = docker_client()
        return self._docker

    async def host_address(self) -> str:
        """The address of the host on the container's network (its gateway): the LLM proxy listens there."""
        network = await asyncio.to_thread(ensure_network, self._engine, self.policy)
        return await asyncio.to_thread(gateway, network)

    async def start(self) -> None:
        """Build or reuse the task's image, start the container and wait for its sidecar.

        Raises:
            SandboxError: an image failed to build, the container failed to start, or its
                sidecar was not ready within ``config.ready_timeout_seconds`` (the container's log is quoted).
        """
        try:
            await asyncio.to_thread(self._create)
            assert self._mount_dir is not None
            await self._connect(f"unix:{self._mount_dir / 'sidecar.sock'}", self._token)
            await self._wait_ready()
            setup = await self.exec(
                ["sh", "-c", _SETUP_SCRIPT], timeout_seconds=self.config.setup_timeout_seconds
            )
            if setup.exit_code != 0:
                raise SandboxError(f"setting up the container failed: {setup.output_text()[-2000:]}")
            if self.task.dockerfile is None and self.task.workspace_seed_dir is not None:
                await self.upload_dir(self.task.workspace_seed_dir, self.layout.workspace)
                await self.exec(["chown", "-R", f"{AGENT_USER}:", self.layout.workspace])
        except BaseException:
            await self.stop()
            raise

    def _create(self) -> None:
        """Blocking part of `start`: images, network, mount folder, container."""
        engine = self._engine
        bundle = ensure_bundle()
        image = self.config.image or task_image(
            engine, self.task, ensure_images(engine).base, image_map=self.config.image_map
        )
        network = ensure_network(engine, self.policy)
        self._mount_dir = Path(tempfile.mkdtemp(prefix=f"reroll-docker-{self.run_id[-24:]}-"))
        self._mount_dir.chmod(0o700)
        self._token = secrets.token_urlsafe(24)
        token_file = self._mount_dir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(self._token)
        environment = self.task.spec.environment
        try:
            self.container = engine.containers.run(
                image,
                entrypoint=[*ENTRYPOINT, "--listen", f"unix:{MOUNT_POINT}/sidecar.sock"],
                command=["--token-file", f"{MOUNT_POINT}/token"],
                detach=True,
                init=True,
                name=f"reroll-{self.run_id}-{secrets.token_hex(3)}",
                hostname=SANDBOX_HOSTNAME,  # the same in every sandbox (not the container's id)
                labels={MANAGED_LABEL: "1", RUN_ID_LABEL: self.run_id, OWNER_LABEL: owner_label()},
                network=network.name,
                mounts=[
                    Mount(MOUNT_POINT, str(self._mount_dir), type="bind"),
                    Mount(MOUNT_DIR, str(bundle), type="bind", read_only=True),
                    Mount(AGENTS_DIR, AGENTS_VOLUME, type="volume", labels={MANAGED_LABEL: "1"}),
                    # Anonymous volumes (seeded from the image, removed with the container): the
                    # workspace and the snapshots live on the host's file system, not the
                    # container's fuse-overlayfs, several times faster for trees of small files.
                    Mount(self.layout.workspace, None, type="volume"),
                    Mount(STATE_DIR, None, type="volume"),
                ],
                nano_cpus=int(environment.cpus * 1e9),
                mem_limit=f"{environment.memory_mb}m",
                memswap_limit=f"{environment.memory_mb}m",  # no swap beyond the memory limit
                pids_limit=environment.pids_max,
                working_dir="/app",
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start a container of {image}: {exc}") from exc

    async def _wait_ready(self) -> None:
        """Poll the sidecar until ready; fail early with the container's log when it exited."""
        assert self.container is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.ready_timeout_seconds
        while True:
            try:
                await self._sidecar.wait_ready(timeout_seconds=min(2.0, max(0.1, deadline - loop.time())))
                return
            except SidecarError as exc:
                await asyncio.to_thread(self.container.reload)
                if self.container.status == "exited" or loop.time() >= deadline:
                    logs = await asyncio.to_thread(self.container.logs, tail=40)
                    raise SandboxError(
                        f"sidecar of container {self.container.name} not ready ({self.container.status}): "
                        f"{exc}\n{logs.decode(errors='replace')}"
                    ) from exc

    @contextlib.asynccontextmanager
    async def egress(self) -> AsyncIterator[dict[str, str]]:
        """Full network access while inside (to install agents), whatever the task's policy.

        Yields:
            Environment for the installer: the host's CA bundle (copied in) for pip and
            requests, since the host may reach the internet through a proxy with its own CA.
        """
        env: dict[str, str] = {}
        bundle = host_ca_bundle()
        if bundle is not None and self.connected:
            await self.put_file(HOST_CA_PATH, bundle.read_bytes())
            env = {
                "PIP_CERT": HOST_CA_PATH,
                "SSL_CERT_FILE": HOST_CA_PATH,
                "REQUESTS_CA_BUNDLE": HOST_CA_PATH,
            }
        if self.policy == "full" or self.container is None:
            yield env
            return
        network = await asyncio.to_thread(ensure_network, self._engine, "full")
        await asyncio.to_thread(network.connect, self.container)
        try:
            yield env
        finally:
            with contextlib.suppress(docker.errors.APIError):
                await asyncio.to_thread(network.disconnect, self.container, force=True)

    async def stop(self) -> None:
        """Remove the container (and its anonymous volumes) and the mount folder. Safe to call twice."""
        await self.disconnect()
        if self.container is not None:
            container, self.container = self.container, None
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(container.remove, force=True, v=True)
        if self._mount_dir is not None:
            shutil.rmtree(self._mount_dir, ignore_errors=True)
            self._mount_dir = None
        if self._docker is not None:
            self._docker.close()
            self._docker = None


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


def _owner_runs(owner: str | None) -> bool:
    """Whether the controller named by an `OWNER_LABEL` value still runs (another host's: assumed so)."""
    if not owner:
        return False  # no owner label: a container from before labels had owners
    host, _, process = owner.partition("/")
    if host != socket.gethostname():
        return True
    pid, _, ticks = process.partition("/")
    return pid.isdigit() and ticks != "" and _start_ticks(int(pid)) == ticks


def prune(run_id: str | None = None, *, running: bool = False) -> dict[str, list[str]]:
    """Remove reroll's leftover containers (their controller is gone) and unused networks.

    Args:
        run_id: only this run's containers, whether its controller runs or not.
        running: also the containers of rollouts whose controller still runs.

    Returns:
        ``{"containers": [names removed], "kept": [names of live rollouts' containers kept],
        "networks": [names removed]}``.

    Raises:
        SandboxError: no Docker Engine answers.
    """
    engine = docker_client()
    removed: dict[str, list[str]] = {"containers": [], "kept": [], "networks": []}
    in_use: set[str] = set()  # the mount folders of the containers kept
    labels = [f"{MANAGED_LABEL}=1"] + ([f"{RUN_ID_LABEL}={run_id}"] if run_id else [])
    filters: dict[str, Any] = {"label": labels}
    try:
        for container in engine.containers.list(all=True, filters=filters):
            name = container.name or container.id or ""
            if not (running or run_id) and _owner_runs(container.labels.get(OWNER_LABEL)):
                removed["kept"].append(name)
                in_use.update(
                    m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == MOUNT_POINT
                )
                continue
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
                removed["containers"].append(name)
        if run_id is None:
            for network in engine.networks.list(filters={"label": f"{MANAGED_LABEL}=1"}):
                with contextlib.suppress(docker.errors.APIError):  # still in use by a live run
                    network.remove()
                    removed["networks"].append(network.name or "")
    finally:
        engine.close()
    for leftover in Path(tempfile.gettempdir()).glob("reroll-docker-*"):
        if str(leftover) not in in_use and (run_id is None or run_id[-24:] in leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)
    return removed
