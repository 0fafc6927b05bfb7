"""The `local` backend's default: a sandbox isolated by Linux namespaces, without Docker.

Each sandbox is a host folder (``/tmp/reroll-local-<run id>-…``, owned by the sandbox's host
user) and a process tree that Debian's bubblewrap starts in fresh user, mount, PID, IPC, UTS and
network namespaces (`reroll.sandbox.local.rootview` says how, and why ``bwrap`` needs the controller's
help for the id maps):

- root inside is an unprivileged host uid of the sandbox's own (`reroll.sandbox.local.identity`:
  each running sandbox has a range of 65536 host ids no other has; the agent's user ``agent``, uid
  1000, is ``base + 1000``), with Docker's default capabilities over the sandbox's
  namespaces only: the host's root files are ``nobody``'s to it, it cannot mount, and what it
  writes into the bound host folders is owned by its mapped ids;
- ``/`` is a sized file system of the task's ``storage_mb`` (`reroll.sandbox.docker.disk`: a sparse
  image loop-mounted on the host, as the docker backend's; btrfs where btrfs-progs is installed,
  with the workspace and HOME as subvolumes snapshotted copy-on-write (`reroll.sandbox.local.cow`),
  else ext4 and the sidecar's tar snapshots) holding only what the rollout
  needs, and everything the sandbox writes: the workspace (the task's ``workdir``, else ``/app``;
  see `_workspace`), ``/logs``, ``/home/agent``, ``/tmp``, ``/var/tmp`` share it, so a fill past
  ``storage_mb`` is ENOSPC inside, never the host's disk. On it: the host's ``/usr`` (``/bin``,
  ``/lib*``…) read-only, a minimal ``/etc`` with the sandbox's users, the verifier folder (a host
  folder the agent cannot write, filled at verify time), the agents folder read-only (writable only in
  `IsolatedSandbox.installer`, whose root is another host user) and the self-contained sidecar
  bundle at ``/opt/reroll-sidecar`` (`reroll.sandbox.sidecar_bundle`: the sidecar never runs
  from the controller's virtualenv, so reroll runs from a clone or a venv anywhere, ``/tmp``
  included). Not the host's ``/root``, ``/home``, ``/tmp``, checkouts, task or jobs folders,
  nor the rest of reroll's cache;
- a task whose Dockerfile does more than this host view makes runs on its own image instead
  (`reroll.sandbox.local.imagefs`): ``/`` is an overlay of the image's unpacked files and the
  sized file system, with the image's ENV, WORKDIR and USER, as a docker container's;
- ``/proc`` shows the sandbox's processes only; when the sandbox stops, its PID 1 is killed and
  the kernel kills whatever is left in it;
- network ``none`` is a loopback-only namespace reaching only the LLM proxy's ports
  (`reroll.sandbox.local.netns`); ``full`` is the same namespace with outbound access through
  ``pasta`` (Debian's ``passt``: user-mode networking, no veth, no firewall rules to leave
  behind), started with every port mapping off (``-t/-u/-T/-U none``, ``--no-map-gw``), so
  neither the host's loopback services nor other rollouts' proxies are reachable; its own proxy
  is forwarded in at the sandbox's own loopback address, as for ``none``.

This needs root, ``bwrap``, ``setpriv``, ``unshare`` (util-linux) and unprivileged user
namespaces (``scripts/install-sandbox-tools`` installs the packages): where that is missing,
`reroll.sandbox.local.backend.local_sandbox` falls back to the plain
`reroll.sandbox.local.plain.LocalSandbox` and says so once; ``--sandbox local-plain`` chooses that
explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import secrets
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, ClassVar

from reroll_contracts.childenv import child_environment
from reroll_contracts.errors import RerollError, SandboxError, SidecarError
from reroll_contracts.proxy import FreezePlan

from reroll.cache import cache_dir
from reroll.host.child_process import ChildProcess
from reroll.host.notices import warn_once
from reroll.sandbox.allowlist import Resolved, name_hosts, resolve
from reroll.sandbox.base import Sandbox, trust_host_ca
from reroll.sandbox.layout import SANDBOX_HOSTNAME, SandboxLayout
from reroll.sandbox.local.cgroups import CgroupError, SandboxCgroup, SandboxLimits, full_filesystems
from reroll.sandbox.local.identity import IdSlot, idmapped_tree, shift_tree
from reroll.sandbox.local.imagefs import ImageRoot, hold, lay_out_overlay, spec_unhonoured
from reroll.sandbox.local.netns import Forwarder, attach_pasta, private_loopback, proxy_env
from reroll.sandbox.local.plain import MAX_NAME_IN_ROOT
from reroll.sandbox.local.rootview import (
    AGENT_ID,
    IMAGE_ID_BASE,
    INSTALLER_ID_BASE,
    Piece,
    RootView,
    chown_tree,
    read_child_pid,
    workspace_folder,
    write_id_maps,
)
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.sandbox.local.storage import PoolSnapshot, SandboxDisk, prune_local_disks
from reroll.sandbox.seam import InstallFolders, local_install_folders
from reroll.sandbox.sidecar_bundle import ENTRYPOINT, MOUNT_DIR, ensure_bundle
from reroll.sandbox.spec import SandboxSpec

AGENT_USER = "agent"
"""The agent's user inside the sandbox (the same name as in the docker backend's containers)."""
ENDED_TIMEOUT_SECONDS = 1.0
"""How long `IsolatedSandbox.start` waits, when ``bwrap`` ended before reporting its child, to
learn how its command ended (exit code or signal, and its log) for the error."""


class IsolatedSandbox(Sandbox):
    """A local sandbox in its own namespaces with a root view of its own; see the module docstring.

    Args:
        spec: what to make (`reroll.sandbox.spec.SandboxSpec`): its ``workspace_seed`` seeds
            the workspace, its ``network`` chooses the network, its ``limits.storage_mb`` sizes
            ``/`` (workspace, logs and home included).
        run_id: the rollout's id, part of the folder's name.
        config: the backend's settings; default: `IsolatedSandboxConfig()`.
    """

    config_model: ClassVar[type[IsolatedSandboxConfig]] = IsolatedSandboxConfig
    """The model of the backend's settings (`reroll.sandbox.base.Backend`)."""

    prune = staticmethod(prune_local_disks)

    def __init__(self, spec: SandboxSpec, run_id: str, config: IsolatedSandboxConfig | None = None) -> None:
        self.spec = spec
        self.run_id = run_id
        self.config = config or IsolatedSandboxConfig()
        self.policy = spec.network
        self.id_base = INSTALLER_ID_BASE
        """The host uid/gid of the sandbox's root: its slot's (`start`), the installer's fixed one."""
        self._slot: IdSlot | None = None
        self._lower_fd: int | None = None
        """The idmapped copy of the image's files while `start` mounts it (`identity.idmapped_tree`)."""
        self.folder = Path(tempfile.mkdtemp(prefix=f"reroll-local-{run_id[:MAX_NAME_IN_ROOT]}-"))
        layout = SandboxLayout(
            root="/",
            workspace=workspace_folder(spec.workdir),
            logs_dir=spec.logs_mount,
            home=f"/home/{AGENT_USER}",
            agents_dir=str(cache_dir() / "agents"),
            agent_user=AGENT_USER,
        )
        super().__init__(layout, f"isolated local sandbox {self.folder}")
        self._address = private_loopback()
        self._token = secrets.token_urlsafe(24)
        self._sidecar_process: ChildProcess | None = None
        self._init_pid: int | None = None
        self.limits = SandboxLimits.of(spec.limits)
        """The task's memory, cpus, pids and sizes, as the sandbox's cgroup and file systems hold them."""
        self._cgroup: SandboxCgroup | None = None
        self._storage: SandboxDisk | None = None
        """The sized file system holding ``/`` (made by `start`, released by `stop`)."""
        self._pooled = False
        """Whether `pool_snapshot` took a snapshot (``keep_snapshots`` None keeps the disk then)."""
        self._hits_at_stop: list[str] = []
        self._forwarder: Forwarder | None = None
        self._pasta_pid: int | None = None
        self._allowed: Resolved | None = None
        """The agent phase's allow-list as resolved at `start` (a ``listed`` spec)."""
        self._image: ImageRoot | None = None
        self._image_hold: IO[str] | None = None
        """A shared lock on `_image`'s unpacked copy while the sandbox lives (`imagefs.hold`)."""
        """The task's image unpacked, when the sandbox runs on it (`start`); None: the host view."""

    @property
    def init_pid(self) -> int | None:
        """The host's pid of the sandbox's PID 1 while it runs (its namespaces are ``/proc/PID/ns/*``)."""
        return self._init_pid

    async def host_address(self) -> str:
        """A loopback address of this sandbox's own: whatever listens on it when the sandbox
        starts is forwarded inside (`reroll.sandbox.local.netns`), whatever the network policy."""
        return self._address

    async def allow_host_port(self, port: int) -> None:
        """Forward the host's `port` on this sandbox's own address inside (the ports listening
        there at `start` already are).

        Raises:
            SandboxError: the forwarding socket could not be made in the namespace.
        """
        if self._forwarder is not None:
            try:
                await self._forwarder.forward_port(port)
            except OSError as exc:
                raise SandboxError(f"{self.label}: cannot forward port {port} inside: {exc}") from exc

    async def alias_host_port(self, address: str, port: int, to_port: int) -> None:
        """Forward `address`:`port` inside (another sandbox's `host_address` and proxy port, which
        a process tree restored from that sandbox still connects to: `reroll.sandbox.local.criu`)
        to this sandbox's host `to_port`.

        Raises:
            SandboxError: the sandbox is not running, or the socket could not be made.
        """
        if self._forwarder is None:
            raise SandboxError(f"{self.label}: not running, no port to alias")
        try:
            await self._forwarder.forward_alias(address, port, to_port)
        except OSError as exc:
            raise SandboxError(f"{self.label}: cannot forward {address}:{port} inside: {exc}") from exc

    async def limits_hit(self) -> list[str]:
        """See `Sandbox.limits_hit`: the OOM kills and refused forks in the sandbox's cgroup,
        whether its sized ``/`` (workspace, logs, home, ``/tmp``) is full, and whether
        ``/dev/shm`` is (`reroll.sandbox.local.cgroups`). Works after the sandbox's processes died;
        after `stop`, what was hit when it stopped."""
        disk = self._storage.disk if self._storage is not None else None
        if self._cgroup is None and self._init_pid is None and disk is None:
            return list(self._hits_at_stop)
        hit = self._cgroup.limits_hit() if self._cgroup is not None else []
        if disk is not None and await asyncio.to_thread(disk.full):
            hit.append(
                f"out of storage: the sandbox's files (workspace, {self.layout.logs_dir}, home, /tmp) "
                f"filled its {disk.size_bytes >> 20} MiB (the task's environment.storage_mb)"
            )
        if self._init_pid is not None:
            hit += full_filesystems(
                Path(f"/proc/{self._init_pid}/root"),
                {"/dev/shm": f"{self.limits.shm_bytes >> 20} MiB, in the task's environment.memory_mb"},
            )
        return hit

    def _limited(self, command: list[str]) -> list[str]:
        """`command` started inside a cgroup of its own holding the task's memory, cpus and pids
        (`reroll.sandbox.local.cgroups`); unchanged, with a warning once, where none can be made."""
        try:
            self._cgroup = SandboxCgroup.create(self.folder.name, self.limits)
        except CgroupError as exc:
            _warn_unlimited_once(str(exc))
            return command
        return self._cgroup.enter_command(command)

    @contextlib.asynccontextmanager
    async def egress(self) -> AsyncIterator[dict[str, str]]:
        """Outbound access while inside (to install agents): ``full`` has it (pasta); ``none``
        gets an HTTP CONNECT proxy inside the sandbox's network namespace while the context
        lasts, named by the usual proxy variables. Either way the host's CA bundle is copied in
        and named for pip and requests (`reroll.sandbox.base.trust_host_ca`): the host may reach
        the internet through a proxy with its own CA, and an interpreter of the agents folder has
        no system bundle."""
        env = await trust_host_ca(self) if self.connected else {}
        if self._forwarder is None or self.policy != "none":
            yield env
            return
        async with self._forwarder.connect_proxy() as url:
            yield env | proxy_env(url)

    @contextlib.asynccontextmanager
    async def allow_only(self, hosts: tuple[str, ...] | None) -> AsyncIterator[dict[str, str]]:
        """See `reroll.sandbox.seam.PhaseAllowList`: the sandbox's allow-list proxy
        (`netns.Forwarder.listed_proxy`) tunnels to `hosts` only while inside.

        Raises:
            SandboxError: the sandbox started without one (its spec is not ``listed``).
        """
        if self._allowed is None or self._forwarder is None:
            raise SandboxError(f"{self.label}: started without an allow-list proxy (spec.listed)")
        resolved = None if hosts is None else await asyncio.to_thread(resolve, hosts)
        self._forwarder.allow(resolved)
        try:
            await name_hosts(self, resolved)
            yield dict(self.layout.network_env)
        finally:
            self._forwarder.allow(self._allowed)

    async def _open_network(self, init_pid: int) -> None:
        """Forward the host's ports into the namespace of `init_pid` (`start`); for a ``listed``
        spec serve the agent phase's allow-list proxy and name it to every process (``/etc/hosts``
        too); else under ``full`` attach pasta.

        Raises:
            SandboxError: a ``listed`` spec under ``full`` (pasta's route out would outlive a list).
            OSError: as `netns.listen_in`.
        """
        self._forwarder = forwarder = Forwarder(f"/proc/{init_pid}/ns/net", self._address)
        await forwarder.forward_host_ports()
        if self.spec.listed and not self.config.agents_writable:
            if self.policy != "none":
                raise SandboxError("local holds no allow-list after a full agent phase: run it on docker")
            self._allowed = await asyncio.to_thread(resolve, self.spec.allowed, self.spec.denied)
            url = await forwarder.listed_proxy(self._allowed)
            self.layout = dataclasses.replace(self.layout, network_env=proxy_env(url, self._address))
            await name_hosts(self, self._allowed)
        elif self.policy != "none":
            self._pasta_pid = await attach_pasta(init_pid, self.folder)

    async def install_store(self) -> InstallFolders:
        """See `reroll.sandbox.seam.SharedInstalls`: `local_install_folders`."""
        return local_install_folders()

    @contextlib.asynccontextmanager
    async def installer(self) -> AsyncIterator[IsolatedSandbox]:
        """A started sandbox of the same task in which the agents folder is writable, stopped
        when the context ends; for installs only (nothing of the task's or the agent's runs in it).

        Raises:
            SandboxError: it could not start.
        """
        update = {"agents_writable": True, "keep_snapshots": False, "from_snapshot": None}
        config = self.config.model_copy(update=update)
        async with IsolatedSandbox(self.spec, f"{self.run_id[:20]}-install", config) as sandbox:
            yield sandbox

    def _view(self, control: Path, bundle: Path) -> RootView:
        agents = Path(self.layout.agents_dir)
        verifier = self.layout.path(self.spec.verifier_mount)
        view = RootView(
            folder=self.folder,
            hostname=SANDBOX_HOSTNAME,
            storage_bytes=self._storage.disk.size_bytes if self._storage is not None else 0,
            root_source=str(self._files("root")),
            shm_bytes=self.limits.shm_bytes,
            id_base=self.id_base,
            folders=[("/root", 0o711), ("/home", 0o755), ("/opt", 0o755)],
            pieces=[
                Piece(str(self._files("app")), self.layout.workspace, writable=True, staged=True),
                Piece(str(self._files("logs")), self.layout.logs_dir, writable=True, staged=True),
                Piece(str(self.folder / "verifier"), verifier, writable=True),
                Piece(str(self._files("home")), self.layout.home, writable=True, staged=True),
                Piece(str(agents), str(agents), writable=self.config.agents_writable, staged=True),
                Piece(str(bundle), MOUNT_DIR, staged=True),
                Piece(str(control), str(control), writable=True),
            ],
        )
        if self._image is None:
            return view
        own = {str(self._files("app")), str(self._files("home"))}  # the image's, on the overlay
        pieces = [piece for piece in view.pieces if piece.source not in own]
        overlay, lower = str(self._files("overlay")), f"/proc/{os.getpid()}/fd/{self._lower_fd}"
        return dataclasses.replace(view, root_source=overlay, lower=lower, folders=[], pieces=pieces)

    def _files(self, name: str) -> Path:
        """The folder `name` on the sandbox's sized file system (host path; root-only above it)."""
        assert self._storage is not None, "made by _lay_out"
        return self._storage.path(name)

    def _lay_out(self, control: Path) -> None:
        """Take the sandbox's host id range, make its sized file system and host folders, seed the
        workspace, give them to the mapped ids.

        Raises:
            SandboxError: no id range is free, or the file system could not be made (not root, no
                loop device).
        """
        if not self.config.agents_writable:  # a rollout: a host id range of its own
            self._slot = IdSlot.acquire()
            self.id_base = self._slot.base
        paths = {"app": self.layout.workspace, "home": self.layout.home}
        if self.config.from_snapshot is not None:
            source = PoolSnapshot.parse(self.config.from_snapshot)
            self._storage = SandboxDisk.child_of(source, self.folder.name, paths)
        else:
            size = self.config.storage_bytes or self.limits.storage_mb << 20
            on = self.config.copy_on_write
            self._storage = SandboxDisk.create(self.run_id, size, paths, copy_on_write=on)
            self._storage.record_ids(self.id_base)  # whose files a pool of it holds
        for sub in ("logs/agent", "logs/verifier"):
            self._files(sub).mkdir(parents=True, exist_ok=True)
        if self._image is not None:
            lay_out_overlay(self._files("overlay"), self._image, [self.layout.agents_dir], self.id_base)
            self._lower_fd = idmapped_tree(self._image.root, IMAGE_ID_BASE, self.id_base)
        (self.folder / "verifier").mkdir()
        control.mkdir(mode=0o700)
        if self.spec.workspace_seed is not None and self._image is None and not self._storage.is_child:
            seed = self.spec.workspace_seed
            shutil.copytree(seed, self._files("app"), dirs_exist_ok=True, symlinks=True)
        root, agent = self.id_base, self.id_base + AGENT_ID
        if self.config.from_snapshot is not None:  # the snapshot's files, owned by its sandbox's range
            pool_base = PoolSnapshot.parse(self.config.from_snapshot).id_base
            for sub in ("root", "app", "home"):
                shift_tree(self._files(sub), pool_base, root)
        chown_tree(self.folder, root, root)
        for sub in ("logs",) if self._storage.root_given else ("root", "logs"):
            chown_tree(self._files(sub), root, root)  # a snapshot's ``/`` keeps its owners
        for sub in ("logs/agent",) if self._storage.is_child else ("app", "logs/agent", "home"):
            chown_tree(self._files(sub), agent, agent)  # a child's are the snapshot's, as they were
        (self.folder / "verifier").chmod(0o700)
        agents = Path(self.layout.agents_dir)
        agents.mkdir(parents=True, exist_ok=True)
        if self.config.agents_writable and agents.stat().st_uid != INSTALLER_ID_BASE:
            chown_tree(agents, INSTALLER_ID_BASE, INSTALLER_ID_BASE)  # once: installs made before
        agents.chmod(0o755)

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """See `Sandbox.snapshot`: copy-on-write (`reroll.sandbox.local.cow.Subvolumes.snapshot`) when
        the disk is btrfs and `paths` are among the workspace and HOME, else the sidecar's tar."""
        paths = paths or [self.layout.workspace]
        cow = self._storage.cow if self._storage is not None else None
        if cow is None or not cow.covers(paths):
            if cow is not None:
                await asyncio.to_thread(cow.forget, name)  # a restore of `name` is now tar's
            return await super().snapshot(name, paths)
        return await asyncio.to_thread(cow.snapshot, name, paths)

    async def pool_snapshot(self, name: str) -> str | None:
        """Snapshot the workspace and HOME as `name` for a kept pool: ``<pool>:<name>``, what
        ``from_snapshot`` takes after this sandbox stops (which then keeps its disk as a pool), with
        ``/`` (`PoolSnapshot.root`) unless the sandbox runs on a task's image; None with
        ``keep_snapshots`` False, without copy-on-write, or on a pool's child. Raises SandboxError
        as `snapshot`."""
        storage, paths = self._storage, self._pool_paths()
        if storage is None or paths is None:
            return None
        # ``/`` too (``/tmp``, services' files) unless it is an image's overlay; one thread hop for
        # the three ioctls: this runs while the agent's request is held (a step's checkpoint)
        await asyncio.to_thread(storage.freeze, name, paths, root=self._image is None)
        self._pooled = True
        return str(PoolSnapshot(storage.disk.folder, name))

    def pool_freeze_plan(self) -> FreezePlan | None:
        """What `pool_snapshot` freezes, for the LLM proxy to take itself at each held step
        (`reroll_contracts.proxy.FreezePlan`, ``step-K``); None where `pool_snapshot` would take
        none. `adopt_pool_snapshot` then claims each snapshot it took. The sandbox's subvolumes
        must stay those it started with meanwhile (no copy-on-write `restore`: a rollout's
        checkpoints restore by the sidecar)."""
        storage, paths = self._storage, self._pool_paths()
        if storage is None or paths is None:
            return None
        return storage.freeze_plan(paths, root=self._image is None)

    def _pool_paths(self) -> list[str] | None:
        """The workspace and HOME, which a pool snapshot freezes; None where none is taken
        (``keep_snapshots`` False, no copy-on-write disk or not covering them, a pool's child)."""
        storage, paths = self._storage, [self.layout.workspace, self.layout.home]
        if self.config.keep_snapshots is False or storage is None or storage.cow is None or storage.is_child:
            return None
        return paths if storage.cow.covers(paths) else None

    def adopt_pool_snapshot(self, name: str) -> str | None:
        """Claim the pool snapshot `name` the proxy took by `pool_freeze_plan` (the disk is then
        kept as a pool when the sandbox stops, as after `pool_snapshot`): ``<pool>:<name>``, None
        when there is no such snapshot."""
        storage = self._storage
        if storage is None or storage.cow is None or not storage.cow.has(name):
            return None
        self._pooled = True
        return str(PoolSnapshot(storage.disk.folder, name))

    async def drop_pool_snapshot(self, name: str) -> None:
        """Delete the pool snapshot `name` (a checkpoint retention let go: `reroll.rollout.extensions.
        checkpoints.retained`); nothing when there is none. Raises SandboxError as `snapshot`."""
        storage = self._storage
        if storage is not None and storage.cow is not None:
            await asyncio.to_thread(storage.cow.forget, name)

    async def restore(self, name: str) -> list[str]:
        """See `Sandbox.restore`: a copy-on-write snapshot by `reroll.sandbox.local.cow.Subvolumes.restore`,
        a tar snapshot by the sidecar."""
        cow = self._storage.cow if self._storage is not None else None
        if cow is None or self._init_pid is None or not cow.has(name):
            return await super().restore(name)
        return await asyncio.to_thread(cow.restore, name, self._init_pid)

    async def start(self) -> None:
        """Lay out the folder, seed the workspace, start the namespaces and the sidecar in them;
        open their network (`_open_network`).

        Raises:
            SandboxError: the namespaces, the sidecar or the setup failed, or the sidecar did not
                answer ready within ``config.ready_timeout_seconds``; what was made is removed.
        """
        control = self.folder / ".reroll"
        try:  # on the task's image where the host view cannot make it (not the installer: host view)
            if not self.config.agents_writable and spec_unhonoured(self.spec):
                from reroll.sandbox.local.imagebuild import image_layout  # the docker SDK: images only

                on_image = functools.partial(
                    image_layout, self.spec, self.layout, self.config.image_map, self.config.image_builder
                )
                image, self.layout = await asyncio.to_thread(on_image)
                self._image, self._image_hold = image, hold(image)
        except BaseException:
            await self.stop()
            raise  # as it is: an image that cannot be built is the task's, not the sandbox's
        try:
            bundle = await asyncio.to_thread(ensure_bundle)
            self._lay_out(control)
        except (RerollError, OSError) as exc:
            await self.stop()
            raise SandboxError(f"{self.label}: cannot lay out: {exc}") from exc
        view = self._view(control, bundle)
        view.write_etc(AGENT_USER)
        socket_path, token_file = control / "sidecar.sock", self._write_token(control)
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        sidecar = [*ENTRYPOINT, "--listen", f"unix:{socket_path}", "--state-dir", str(control / "state")]
        self._sidecar_process = ChildProcess(
            "reroll_sidecar",
            ["--token-file", str(token_file)],
            workdir=control,
            name="sidecar",
            env=child_environment({"TMPDIR": "/tmp", "HOME": "/root"}),
            command=self._limited(view.command(sidecar, info_write, block_read)),
            pass_fds=(info_write, block_read),
        )
        process = self._sidecar_process
        unclosed = [info_read, info_write, block_read, block_write]
        try:
            starting = asyncio.ensure_future(process.start(self.config.ready_timeout_seconds))
            while process.pid is None and not starting.done():  # spawned: its copies of the pipes exist
                await asyncio.sleep(0.002)
            for end in (info_write, block_read):
                os.close(end)
                unclosed.remove(end)
            unclosed.remove(info_read)  # the handshake closes it
            handshake = asyncio.ensure_future(asyncio.to_thread(self._map_ids, info_read, block_write))
            await asyncio.wait([handshake, starting], return_when=asyncio.FIRST_EXCEPTION)
            if handshake.done() and handshake.exception() is not None and not starting.done():
                await asyncio.wait([starting], timeout=ENDED_TIMEOUT_SECONDS)
            if starting.done() and starting.exception() is not None:
                handshake.add_done_callback(_retrieve)
                await starting  # raises: how bwrap's command ended says more than its empty report
            if handshake.done() and handshake.exception() is not None:
                starting.cancel()
            self._init_pid = await handshake
            await starting
            await self.connect(f"unix:{socket_path}", self._token)
            await self.wait_ready(timeout_seconds=self.config.ready_timeout_seconds)
            await self._open_network(self._init_pid)
            if self._image is not None:
                from reroll.sandbox.local.imagebuild import settle  # the docker SDK: images only

                await settle(self, self.spec, self._image, self.config.setup_timeout_seconds)
        except (RerollError, OSError) as exc:
            await self.stop()
            raise SandboxError(f"{self.label}: did not start: {exc}") from exc
        finally:
            for end in unclosed if self._lower_fd is None else [*unclosed, self._lower_fd]:
                with contextlib.suppress(OSError):
                    os.close(end)
            self._lower_fd = None  # the overlay holds the mount now
            token_file.unlink(missing_ok=True)

    def _write_token(self, control: Path) -> Path:
        """Write the sidecar's token to ``control/token`` (a new file, mode 0600, owned by the
        sandbox's root) and return its path; `start` removes it once the sidecar has read it."""
        token_file = control / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._token)
        os.chown(token_file, self.id_base, self.id_base)
        return token_file

    def _map_ids(self, info_read: int, block_write: int) -> int:
        """bwrap's handshake: read its child's pid, write the id maps, let it go on; the pid.

        Raises:
            OSError: bwrap exited first, or the maps could not be written.
        """
        pid = read_child_pid(info_read)
        write_id_maps(pid, self.id_base)
        os.write(block_write, b"1")
        return pid

    async def stop(self) -> None:
        """Kill the sandbox's processes (its PID 1: the kernel ends the rest), stop the forwarding
        and pasta, delete the folder and the cgroup (killing what is left in it). Safe to call twice."""
        if self._cgroup is not None or self._init_pid is not None or self._storage is not None:
            self._hits_at_stop = await self.limits_hit()
        if self.connected:
            with contextlib.suppress(SidecarError):
                await self.kill()
        await self.disconnect()
        if self._forwarder is not None:
            await self._forwarder.close()
            self._forwarder = None
        for attribute in ("_init_pid", "_pasta_pid"):
            pid = getattr(self, attribute)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                setattr(self, attribute, None)
        if self._sidecar_process is not None:
            await self._sidecar_process.stop()
            self._sidecar_process = None
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)  # kills what is left in it
            self._cgroup = None
        if self._storage is not None:  # the host never walks the agent's files
            keep = bool(self.config.keep_snapshots) or (self.config.keep_snapshots is None and self._pooled)
            await asyncio.to_thread(self._storage.release, keep_snapshots=keep)
            self._storage = None
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._lower_fd is not None:
            os.close(self._lower_fd)
            self._lower_fd = None
        if self._slot is not None:  # after its processes and files are gone
            self._slot.release()
            self._slot = None
        if self._image_hold is not None:
            self._image_hold.close()
            self._image_hold = None


def _retrieve(future: asyncio.Future[int]) -> None:
    """Take `future`'s outcome, which another error supersedes (asyncio logs one never taken)."""
    if not future.cancelled():
        future.exception()


def _warn_unlimited_once(reason: str) -> None:
    warn_once(
        f"reroll: the local sandbox's cgroup cannot be made here ({reason}); its processes run "
        "without the task's memory, cpus and pids limits"
    )
