"""The `docker` sandbox backend: one container per rollout, its sidecar as the entrypoint.

The container runs the task's image as it is (see `reroll.sandbox.docker.images`; built on first use,
no registry needed) with the sidecar as its main process: the self-contained sidecar bundle
(`reroll.sandbox.sidecar_bundle`, built once per machine) is mounted read-only at
``/opt/reroll-sidecar``, so the image needs neither Python nor any tool of reroll's. The
controller reaches the sidecar over a Unix socket in a host folder bind-mounted at
``/run/reroll`` (mode 0700, root only, so the agent cannot reach it; the token file lies
beside it) — a socket works under every network policy, where a published port does not on an
internal network.

Network policy (the task's ``environment.network``): ``full`` joins the shared bridge network
``reroll-full`` (inter-container traffic off: its sandboxes never reach each other). ``none``
gets a network of its own, ``reroll-none-<key>`` (bridge interface
``rr-<key>``): *internal* (no route out), and firewalled on the host (`reroll.sandbox.docker.firewall`,
nftables): from it only the bridge's gateway (`host_address`, where the LLM proxy listens) is
reachable, and there only the ports `allow_host_port` opens (the proxy's, the interceptor's);
no other host address (docker0, the host's own IPs, services on all addresses), no other
network, so no other rollout's sandbox either. The network and its table are made by the first
of `host_address` and `start`, and removed by `stop`. Where a phase has an allow-list (the spec's
``listed``), the network is routed instead of internal and its firewall lets through that phase's
addresses, resolved on the host when the network is made (the agent's) or when `allow_only` is
entered (the verify's); ``full`` is then every address but the host's. Installing an agent needs
PyPI, so `egress` lends ``reroll-full`` for the install only.

Limits (the task's ``environment``): ``cpus``, ``memory_mb`` (swap included), ``pids_max`` and
``storage_mb``: the workspace, the logs folder, ``/home`` and ``/root`` (the agent's HOME),
``/tmp`` and ``/var/tmp`` are volumes on one loop-mounted file system of that size
(`reroll.sandbox.docker.disk`, `SIZED_FOLDERS`; the engine's storage driver may have no size
option, fuse-overlayfs has none), and so is the container's own writable layer, where everything
else the agent writes lands (``/usr/local``, ``/opt``, ``/var``: `reroll.sandbox.docker.layer`),
so every writable path shares the one quota. `limits_hit` tells when the kernel's OOM killer
struck in the container or that file system is full. Not capped: the sidecar's snapshots.

Conventions (the spec's, `reroll.sandbox.spec.SandboxSpec`): the agent works in the task's ``workdir``, else
the image's WORKDIR, else ``/app``; it runs as the task's user — ``agent`` (unprivileged, created
when the image lacks it) for native tasks, the image's USER (root when unset) for legacy ones, or
``agent.user`` — and the sidecar itself always runs as root.

Shared installs (`reroll.installs.store`): agents and the Python runtime are installed once into
the volume ``reroll-agents``, mounted read-only at ``/opt/reroll-agents`` in every rollout's
container, so not even its root can change what later rollouts run. Installs are made in a
short-lived *install container* of their own (`DockerSandbox.installer`: the same image, the
volume read-write, network ``full``, no workspace; labelled ``reroll.role=install``), which runs
only the install script. Their manifests are in the volume ``reroll-agents-manifests``, which no
container mounts; the controller reads both volumes at their host folders (a local engine, as
the sized file systems need already). `prune` keeps both volumes.

Services (`reroll.environment.services`): the task's image services are sibling containers
(`DockerSandbox.start_sibling`, labelled ``reroll.role=service``; a service with a ``build`` runs
the image `start` built for it, `reroll.sandbox.docker.images.service_image`) on the rollout's network under
their names, with the task's cpus, memory and pids limits; such a rollout always has a network of
its own — ``reroll-services-<key>`` under ``full`` (`reroll.sandbox.docker.networks`), and under
``none`` its ``reroll-none-<key>`` with inter-container traffic on (the firewall lets it pass on
that bridge only). `image_command` gives the image's own ENTRYPOINT and CMD, which an image that
owns its services' lifecycle needs started (the sidecar took its place).

Every container carries the labels ``reroll.managed=1``, ``reroll.run_id=<run id>`` and
``reroll.owner`` (the controller process that started it); `stop` removes it (and its siblings),
and `prune` sweeps what killed controllers left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import ClassVar

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import Mount
from reroll_contracts.errors import SandboxError, SidecarError
from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR

from reroll.host.owner import owner_label
from reroll.sandbox.ahead import lead_first, start_ahead, take_ahead
from reroll.sandbox.allowlist import Resolved, name_hosts, resolve
from reroll.sandbox.base import trust_host_ca
from reroll.sandbox.docker import disk, firewall, layer, seccomp
from reroll.sandbox.docker.cgroups import oom_kills
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.conventions import (
    AGENT_USER,
    AGENTS_DIR,
    SETUP_SCRIPT,
    docker_name,
    image_defaults,
)
from reroll.sandbox.docker.engine import (
    AGENTS_VOLUME,
    DISK_LABEL,
    MOUNT_POINT,
    OWNER_LABEL,
    ROLE_LABEL,
    RUN_ID_LABEL,
    docker_client,
)
from reroll.sandbox.docker.images import MANAGED_LABEL, ensure_images, service_image, task_image
from reroll.sandbox.docker.installs import install_store
from reroll.sandbox.docker.networks import (
    SERVICES_PREFIX,
    create_isolated_network,
    create_services_network,
    ensure_full_network,
    gateway,
    remove_isolated_network,
)
from reroll.sandbox.docker.prune import prune as prune_leftovers
from reroll.sandbox.docker.siblings import SiblingContainer, run_sibling
from reroll.sandbox.docker.snapshots import CowSnapshots
from reroll.sandbox.layout import SANDBOX_HOSTNAME, SandboxLayout
from reroll.sandbox.seam import InstallFolders, ServiceProcess
from reroll.sandbox.sidecar_bundle import ENTRYPOINT, MOUNT_DIR, ensure_bundle
from reroll.sandbox.spec import SandboxSpec, SiblingService

STATE_DIR = "/var/lib/reroll-sidecar"
"""The sidecar's private folder (its default ``--state-dir``): snapshots."""
READY_FILE = "ready.json"
"""In the mount folder: written by the sidecar once it listens (``--ready-file``)."""
READY_POLL_SECONDS = 0.01
SIZED_FOLDERS = {"/tmp": ("tmp", 0o1777), "/var/tmp": ("vartmp", 0o1777)}
SIZED_FOLDERS |= {"/home": ("home", 0o755), "/root": ("root", 0o700)}
"""The container's folders, besides the workspace and the logs, on the sized file system:
path → (its folder there, mode; the image's content and modes are copied in when it has them)."""


class DockerSandbox(CowSnapshots):
    """A sandbox in a Docker container; see the module docstring.

    Args:
        spec: what to make (`reroll.sandbox.spec.SandboxSpec`): its image build, limits and
            network shape the container.
        run_id: the rollout's id, the container's ``reroll.run_id`` label and part of its name.
        config: the backend's settings; default: `DockerSandboxConfig()`.
        installs_writable: an install container (see `installer`): `AGENTS_VOLUME` read-write,
            network ``full``, no workspace or sized file system.
    """

    config_model: ClassVar[type[DockerSandboxConfig]] = DockerSandboxConfig
    """The model of the backend's settings (`reroll.sandbox.base.Backend`)."""

    @classmethod
    def prune(
        cls, config: DockerSandboxConfig, run_id: str | None = None, *, running: bool = False
    ) -> dict[str, list[str]]:
        """The backend's sweep: the module's `prune` (`config` changes nothing of it).

        Raises:
            SandboxError: as the module's `prune`.
        """
        return prune_leftovers(run_id, running=running)

    def __init__(
        self,
        spec: SandboxSpec,
        run_id: str,
        config: DockerSandboxConfig | None = None,
        *,
        installs_writable: bool = False,
    ) -> None:
        self.spec = spec
        self.run_id = run_id
        self.config = config or DockerSandboxConfig()
        self.installs_writable = installs_writable
        self.policy = "full" if installs_writable else spec.network
        layout = SandboxLayout(  # workspace, home and user are settled by `start` (the image's defaults)
            root="/",
            workspace=spec.workdir or DEFAULT_WORKDIR,
            logs_dir=spec.logs_mount,
            home=f"/home/{AGENT_USER}",
            agents_dir=AGENTS_DIR,
            agent_user=spec.agent_user or AGENT_USER,
        )
        super().__init__(layout, f"docker sandbox {run_id}")
        self.container: Container | None = None
        self._docker: docker.DockerClient | None = None
        self._mount_dir: Path | None = None
        self._token = ""
        self._user = AGENT_USER
        """The agent's user as asked (the task's, else the image's USER), settled by the setup script."""
        self._disk: disk.SizedDisk | None = None
        self._layer: Path | None = None
        """The container's writable layer's host folder, on `_disk` (`reroll.sandbox.docker.layer`)."""
        self._volumes: list[str] = []
        """The named volumes on `_disk` (removed by `stop`)."""
        self._network: Network | None = None
        self._firewall_key = ""
        """The key of the network's firewall table (`reroll.sandbox.docker.firewall`); "" under ``full``."""
        self._allowed: Resolved | None = None
        """The agent phase's allow-list as resolved when the network was made (a ``listed`` spec)."""
        self._image = ""
        """The image the container runs (settled by `start`)."""
        self._siblings: list[Container] = []
        """The containers of the task's image services (`start_sibling`), removed by `stop`."""
        self._service_images: dict[str, str] = {}
        """The images built for the task's services that have a ``build``, by service (`start`)."""

    @property
    def _engine(self) -> docker.DockerClient:
        if self._docker is None:
            self._docker = docker_client()
        return self._docker

    def _ensure_network(self) -> Network:
        """The container's network (made on first call): ``reroll-full``, or for ``none`` its own;
        a task with image services always gets its own (`create_services_network` under ``full``;
        under ``none`` its containers reach each other)."""
        if self._network is None:
            services = not self.installs_writable and bool(self.spec.siblings)
            listed = not self.installs_writable and self.spec.listed
            if self.policy == "full" and services and not listed:
                self._network = create_services_network(self._engine, self.run_id)
            elif self.policy == "full" and not listed:
                self._network = ensure_full_network(self._engine)
            else:
                self._allowed = resolve(self._agent_hosts, self.spec.denied) if listed else None
                self._network, self._firewall_key = create_isolated_network(
                    self._engine, self.run_id, services=services, allowed=self._allowed
                )
        return self._network

    @property
    def _agent_hosts(self) -> tuple[str, ...] | None:
        """The agent phase's allow-list; None under ``full``."""
        return None if self.policy == "full" else self.spec.allowed

    @contextlib.asynccontextmanager
    async def allow_only(self, hosts: tuple[str, ...] | None) -> AsyncIterator[dict[str, str]]:
        """See `reroll.sandbox.seam.PhaseAllowList`: the firewall's sets hold `hosts`' addresses
        while inside (`firewall.set_allowed`), the agent phase's again after; the names resolved
        are added to the container's ``/etc/hosts``.

        Raises:
            SandboxError: the sandbox has no allow-list firewall (its spec is not ``listed``), or
                nft failed.
        """
        if self._allowed is None or not self._firewall_key:
            raise SandboxError(f"{self.label}: started without an allow-list firewall (spec.listed)")
        resolved = await asyncio.to_thread(resolve, hosts)
        await asyncio.to_thread(firewall.set_allowed, self._firewall_key, resolved)
        try:
            await name_hosts(self, resolved)
            yield {}
        finally:
            await asyncio.to_thread(firewall.set_allowed, self._firewall_key, self._allowed)

    async def host_address(self) -> str:
        """The address of the host on the container's network (its gateway): the LLM proxy listens there.

        Under network ``none`` this makes the rollout's own network and firewall (see the module
        docstring), which `stop` removes.
        """
        network = await asyncio.to_thread(self._ensure_network)
        return await asyncio.to_thread(gateway, network)

    async def allow_host_port(self, port: int) -> None:
        """Let the container reach TCP `port` on `host_address` (under ``full`` it reaches every port).

        Raises:
            SandboxError: the firewall could not be changed.
        """
        await asyncio.to_thread(self._ensure_network)
        if self._firewall_key:
            await asyncio.to_thread(firewall.allow_port, self._firewall_key, port)

    async def start(self) -> None:
        """Build or reuse the task's image (and its services' images that have a ``build``),
        start the container and wait for its sidecar; or adopt the same sandbox started ahead.

        Raises:
            SandboxError: an image failed to build, the container failed to start, or its
                sidecar was not ready within ``config.ready_timeout_seconds`` (the container's log is quoted).
        """
        if not self.installs_writable and await self._take_ahead():  # an installer takes none
            return
        try:
            # The first started ahead creates alone (`reroll.sandbox.ahead.lead_first`).
            await asyncio.to_thread(lead_first(self.run_id)(self._create))
            assert self._mount_dir is not None
            await self.connect(f"unix:{self._mount_dir / 'sidecar.sock'}", self._token)
            await self._wait_ready()
            setup = await self.exec(
                ["sh", "-c", SETUP_SCRIPT, "setup", self._user, self.layout.workspace],
                timeout_seconds=self.config.setup_timeout_seconds,
            )
            if setup.exit_code != 0:
                raise SandboxError(f"setting up the container failed: {setup.output_text()[-2000:]}")
            user, home = setup.stdout.decode().split()[-2:]
            # The sidecar's own user (root) is "": quiesce then kills every process Exec started.
            self.layout = dataclasses.replace(
                self.layout, home=home, agent_user="" if user == "root" else user
            )
            if self._allowed is not None:
                await name_hosts(self, self._allowed)
            seed = self.spec.workspace_seed
            child = self.config.from_snapshot is not None
            if self.spec.build is None and seed is not None and not self.installs_writable and not child:
                await self.upload_dir(seed, self.layout.workspace)
                if self.layout.agent_user:
                    await self.exec(["chown", "-R", f"{self.layout.agent_user}:", self.layout.workspace])
        except BaseException:
            await self.stop()
            raise

    def start_ahead(self) -> bool:
        """See `reroll.sandbox.ahead.StartsAhead`: on the shared network (``full``, no services or
        allow-list) only; the rollout's object makes a network of its own in `host_address`."""
        if self.installs_writable or self.policy != "full" or self.spec.siblings or self.spec.listed:
            return False
        start_ahead(self, self.run_id)
        return True

    async def _take_ahead(self) -> bool:
        """Adopt the sandbox started ahead for this run id (`reroll.sandbox.ahead.take_ahead`) when
        it is this one (spec, settings, network policy), else stop it; whether one was adopted."""
        ahead = await take_ahead(self.run_id, self)
        if ahead is None:
            return False
        if not isinstance(ahead, DockerSandbox) or self.container is not None or self._key() != ahead._key():
            await ahead.stop()
            return False
        if self._docker is not None:  # `host_address`'s client: the adopted one has its own
            self._docker.close()
        vars(self).update(vars(ahead))
        return True

    def _key(self) -> tuple[object, ...]:
        """What makes two sandboxes of one run id the same sandbox."""
        return (self.spec, self.config, self.policy, self.installs_writable)

    def _create(self) -> None:
        """Blocking part of `start`: images, network, mount folder, container."""
        engine = self._engine
        bundle = ensure_bundle()
        base = ensure_images(engine).base
        image = self.config.image or task_image(engine, self.spec, base, image_map=self.config.image_map)
        if not self.installs_writable:  # built before the readiness gate's clock starts
            self._service_images = {
                service.name: service_image(engine, self.spec, service, base, image_map=self.config.image_map)
                for service in self.spec.siblings
                if service.build is not None
            }
        defaults = image_defaults(engine, image)
        self._image = image
        self.layout = dataclasses.replace(
            self.layout, workspace=self.spec.workdir or defaults.workdir, image_env=defaults.env
        )
        self._user = self.spec.agent_user or defaults.user
        network = self._ensure_network()
        self._make_mount_dir()
        limits = self.spec.limits
        sized = {} if self.installs_writable else self._sized_volumes(limits.storage_mb)
        role = "install" if self.installs_writable else "rollout"
        labels = {MANAGED_LABEL: "1", RUN_ID_LABEL: self.run_id, OWNER_LABEL: owner_label(), ROLE_LABEL: role}
        name = docker_name(self.run_id)
        try:
            # Created, then started: a start that fails leaves a container `stop` knows to remove.
            self.container = engine.containers.create(
                image,
                entrypoint=[*ENTRYPOINT, "--listen", f"unix:{MOUNT_POINT}/sidecar.sock"],
                command=[
                    "--token-file",
                    f"{MOUNT_POINT}/token",
                    "--ready-file",
                    f"{MOUNT_POINT}/{READY_FILE}",
                ],
                init=True,
                name=f"reroll-{name}-{'install-' * self.installs_writable}{secrets.token_hex(3)}",
                hostname=SANDBOX_HOSTNAME,  # the same in every sandbox (not the container's id)
                labels=labels,
                network=network.id,  # by id: a name can be ambiguous (`ensure_full_network`)
                mounts=[
                    Mount(MOUNT_POINT, str(self._mount_dir), type="bind"),
                    Mount(MOUNT_DIR, str(bundle), type="bind", read_only=True),
                    # Read-only but in an install container: no rollout changes what later ones run.
                    Mount(
                        AGENTS_DIR,
                        AGENTS_VOLUME,
                        type="volume",
                        read_only=not self.installs_writable,
                        labels={MANAGED_LABEL: "1"},
                    ),
                    # Volumes (seeded from the image) on the host's file system, not the
                    # container's fuse-overlayfs, several times faster for trees of small files:
                    # the workspace, logs, homes and temporary folders on the sized one, the
                    # snapshots anonymous.
                    *(Mount(target, name, type="volume") for target, name in sized.items()),
                    Mount(STATE_DIR, None, type="volume"),
                ],
                nano_cpus=int(limits.cpus * 1e9),
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",  # no swap beyond the memory limit
                pids_limit=limits.pids_max,
                working_dir=self.layout.workspace,
                user="0:0",  # the sidecar is root whatever the image's USER; the agent's user is Exec's
                security_opt=[f"seccomp={seccomp.profile()}"],  # Docker's, plus a verify's namespaces
            )
            if self._disk is not None:  # before start: the overlay's upper folder on the quota
                self._layer = layer.mount_layer(self.container, self.layer_home())
            self.give_layer(self.container)  # a child's: its pool snapshot's layer, before it starts
            self.container.start()
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start a container of {image}: {exc}") from exc

    def _make_mount_dir(self) -> None:
        """Make the sandbox's mount folder (0700, the sidecar's socket and ready file go there) and
        the sidecar's token in it (0600)."""
        self._mount_dir = Path(tempfile.mkdtemp(prefix=f"reroll-docker-{docker_name(self.run_id)[-24:]}-"))
        self._mount_dir.chmod(0o700)
        self._token = secrets.token_urlsafe(24)
        token_file = self._mount_dir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(self._token)

    def _sized_volumes(self, storage_mb: int) -> dict[str, str]:
        """Make the sandbox's sized file system and its volumes: container path → volume name
        (the workspace, the logs folder and `SIZED_FOLDERS`; a path named twice is one volume,
        the workspace's, then the logs')."""
        owner = owner_label()
        folders = {self.layout.workspace: ("app", 0o755), self.layout.logs_dir: ("logs", 0o755)}
        folders |= {path: entry for path, entry in SIZED_FOLDERS.items() if path not in folders}
        hosts = self.make_disk(docker_name(self.run_id), storage_mb << 20, folders, owner)
        assert self._disk is not None
        labels = {MANAGED_LABEL: "1", RUN_ID_LABEL: self.run_id, OWNER_LABEL: owner}
        labels[DISK_LABEL] = str(self._disk.folder)
        volumes = {
            target: f"{self._disk.folder.name}-{folder}-{secrets.token_hex(2)}"
            for target, (folder, _) in folders.items()
        }
        binds = {volumes[target]: host for target, host in hosts.items()}
        disk.bind_volumes(self._engine, binds, labels, made=self._volumes)
        return volumes

    async def install_store(self) -> InstallFolders:
        """See `reroll.sandbox.seam.SharedInstalls`: `AGENTS_VOLUME` and `MANIFESTS_VOLUME`
        at their host folders, each made when missing.

        Raises:
            SandboxError: a volume cannot be made, or its folder is not readable here (a remote
                engine, or a controller that is not root).
        """
        return await asyncio.to_thread(install_store, self._engine)

    @contextlib.asynccontextmanager
    async def installer(self) -> AsyncIterator[DockerSandbox]:
        """See `reroll.sandbox.seam.SharedInstalls`: an install container of this rollout's
        image (labelled ``reroll.role=install`` and with this rollout's run id), removed at the end.

        Raises:
            SandboxError: it could not start.
        """
        config = self.config.model_copy(update={"image": self._image or self.config.image})
        installer = DockerSandbox(self.spec, self.run_id, config, installs_writable=True)
        try:
            await installer.start()
            yield installer
        finally:
            await installer.stop()

    async def limits_hit(self) -> list[str]:
        """See `Sandbox.limits_hit`: the kernel's OOM kills in the container's memory cgroup, and
        whether its sized file system (`reroll.sandbox.docker.disk`) is full."""
        hit = []
        limits = self.spec.limits
        if self.container is not None:
            await asyncio.to_thread(self.container.reload)
            kills = oom_kills(int(self.container.attrs["State"].get("Pid") or 0))
            if kills or self.container.attrs["State"].get("OOMKilled"):
                hit.append(
                    f"out of memory: the kernel killed {kills or 'a'} process(es) at the sandbox's limit "
                    f"of {limits.memory_mb} MiB (the task's environment.memory_mb)"
                )
        if self._disk is not None and await asyncio.to_thread(self._disk.full):
            hit.append(
                "out of disk: the workspace, logs, homes, /tmp and the container's own layer "
                "(/usr, /opt, /var …) filled the sandbox's quota of "
                f"{limits.storage_mb} MiB "
                "(the task's environment.storage_mb)"
            )
        return hit

    async def _wait_ready(self) -> None:
        """Wait for the sidecar's `READY_FILE` in the mount folder (polled on the host every
        `READY_POLL_SECONDS`: no gRPC reconnect backoff between its bind and our first call), then
        poll the sidecar until ready; fail early with the container's log when it exited."""
        assert self.container is not None and self._mount_dir is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.ready_timeout_seconds
        ready_file, checked = self._mount_dir / READY_FILE, loop.time()
        while not os.path.lexists(ready_file) and loop.time() < deadline:
            await asyncio.sleep(READY_POLL_SECONDS)
            if loop.time() - checked >= 1.0:  # an exited container never writes it
                checked = loop.time()
                await asyncio.to_thread(self.container.reload)
                if self.container.status == "exited":
                    break
        while True:
            try:
                await self.wait_ready(timeout_seconds=min(2.0, max(0.1, deadline - loop.time())))
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
        env = await trust_host_ca(self) if self.connected else {}
        if self.policy == "full" or self.container is None:
            yield env
            return
        network = await asyncio.to_thread(ensure_full_network, self._engine)
        await asyncio.to_thread(network.connect, self.container)
        try:
            yield env
        finally:
            with contextlib.suppress(docker.errors.APIError):
                await asyncio.to_thread(network.disconnect, self.container, force=True)

    async def start_sibling(self, name: str, env: Mapping[str, str]) -> ServiceProcess:
        """See `reroll.sandbox.seam.SiblingServices`: a container of the spec's sibling `name`:
        of the image built for its ``build`` by `start`, else of its ``image`` (pulled when not
        local), on the sandbox's network under the alias `name`, with the spec's cpus, memory and
        pids limits and the sandbox's labels (``reroll.role=service``), as the image's user; its
        ``command`` replaces the image's entrypoint and command (``sh -c``).

        Raises:
            TaskEnvironmentError: the image is missing and cannot be pulled (the task's fault).
            SandboxError: the spec has no sibling `name`, or the engine failed to start the
                container (infrastructure, retried).
        """
        try:
            service = self.spec.sibling(name)
        except KeyError as exc:
            raise SandboxError(str(exc.args[0])) from exc
        return await asyncio.to_thread(self._start_sibling, service, dict(env))

    def _start_sibling(self, service: SiblingService, env: dict[str, str]) -> SiblingContainer:
        image = self._service_images.get(service.name)
        network = self._ensure_network()
        container = run_sibling(self._engine, network, self.run_id, self.spec.limits, service, image, env)
        self._siblings.append(container)
        return SiblingContainer(container)

    async def image_command(self) -> list[str]:
        """See `reroll.sandbox.seam.SiblingServices`: the image's ENTRYPOINT and CMD."""
        config = (await asyncio.to_thread(self._engine.images.get, self._image)).attrs.get("Config") or {}
        return [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]

    async def stop(self) -> None:
        """Remove the container (and its anonymous volumes), its services' containers, its own
        network (and firewall table, network ``none``) and the mount folder. Safe to call twice."""
        await self.disconnect()
        for sibling in self._siblings:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(sibling.remove, force=True, v=True)
        self._siblings = []
        if self.container is not None:
            container, self.container = self.container, None
            if self._layer is not None:  # unmounted first: the daemon then never walks the agent's files
                await asyncio.to_thread(layer.release, container, self._layer)
                self._layer = None
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(container.remove, force=True, v=True)
        for name in self._volumes:
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(self._engine.volumes.get(name).remove, force=True)
        self._volumes = []
        await asyncio.to_thread(self.release_disk)
        if self._firewall_key and self._network is not None:
            await asyncio.to_thread(remove_isolated_network, self._network)
        elif self._network is not None and str(self._network.name).startswith(SERVICES_PREFIX):
            with contextlib.suppress(docker.errors.APIError):
                await asyncio.to_thread(self._network.remove)
        self._network, self._firewall_key = None, ""
        if self._mount_dir is not None:
            shutil.rmtree(self._mount_dir, ignore_errors=True)
            self._mount_dir = None
        if self._docker is not None:
            self._docker.close()
            self._docker = None
