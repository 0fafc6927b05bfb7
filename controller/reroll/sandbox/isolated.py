"""The `local` backend's default: a sandbox isolated by Linux namespaces, without Docker.

Each sandbox is a host folder (``/tmp/reroll-local-<run id>-…``, root only) and a process tree
in fresh mount, PID, IPC and UTS namespaces — plus a network namespace for policy ``none`` —
started through util-linux ``unshare``; `reroll.sandbox.namespace_init` (PID 1) builds its root:

- ``/`` is a copy-on-write overlay of the host's root file system: the agent and the verifier
  see the host's programs (Python, the agents installed under reroll's cache), and what they
  write — ``pip install`` into ``/usr``, ``/etc``, HOME — lands in the overlay's upper layer, a
  tmpfs that dies with the sandbox, sized by the task's ``storage_mb`` (and ``memory_mb``: see
  `reroll.sandbox.cgroups`) and shared with ``/tmp``;
- the workspace (the task's ``workdir``, else ``/app``; ``/app`` where the workdir would hide
  the host's interpreter or reroll's cache, see `_workspace`), ``/logs`` and the task's verifier
  folder are bound to the sandbox
  folder's ``app/``, ``logs/`` and ``verifier/``, so task scripts with absolute paths run
  unchanged, as in a container; the agents folder (``<cache>/agents``) is bound read-write at its
  own path (installs are shared by every rollout; the agent's user cannot write there);
- ``/tmp``, ``/run`` and ``/dev`` are private (``/dev/shm`` sized); ``/proc`` shows the
  sandbox's processes only (the controller, the proxy and their environments are invisible),
  and when the sandbox stops, its PID 1 exits and the kernel kills whatever is left in it;
- the task's ``memory_mb``, ``cpus`` and ``pids_max`` hold for the whole process tree: it starts
  in a cgroup of its own (v1 or v2, `reroll.sandbox.cgroups`), removed by `stop` with whatever
  is left in it; where no cgroup can be made, a warning says so once and the limits are not set;
- network ``full`` shares the host's network; ``none`` is a loopback-only namespace reaching
  only the LLM proxy (`reroll.sandbox.netns`, which says why not a veth pair).

The agent runs as the unprivileged user ``agent`` whatever the task asks (a legacy task's root
agent too: root here is the host's), added to the overlay's ``/etc/passwd`` when
the host has none (the host's file is untouched), with HOME ``/home/agent``; the overlay is
mounted ``nosuid``, so the host's set-user-ID programs give it nothing. The sidecar and the
verifier run as root — the host's root, without a user namespace: the task's own scripts are
trusted as in a container run with all capabilities, the agent is not. This needs root (or
CAP_SYS_ADMIN) on a kernel with overlayfs: where that is missing, `local_sandbox` falls back to
the plain `reroll.sandbox.local.LocalSandbox` and says so once; ``--sandbox local-plain``
chooses that explicitly. Not done: an unprivileged variant in a user namespace (its
``none`` network would need the listening sockets passed out by file descriptor, since an
unprivileged controller cannot join the namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from reroll.childenv import child_environment
from reroll.config import cache_dir
from reroll.errors import RerollError, SandboxError, SidecarError
from reroll.processes import ChildProcess
from reroll.sandbox.base import SANDBOX_HOSTNAME, Sandbox, SandboxLayout
from reroll.sandbox.cgroups import CgroupError, SandboxCgroup, SandboxLimits, full_filesystems
from reroll.sandbox.local import MAX_NAME_IN_ROOT, LocalSandbox
from reroll.sandbox.namespace_init import Bind, NamespaceSpec
from reroll.sandbox.netns import Forwarder, private_loopback
from reroll.sandbox.sidecar_sandbox import SidecarSandbox
from reroll.tasks import DEFAULT_WORKDIR, Task

AGENT_USER = "agent"
"""The agent's user inside the sandbox (the same name as in the docker backend's containers)."""
UNSHARE_FLAGS = ["--mount", "--pid", "--fork", "--ipc", "--uts", "--kill-child", "--propagation", "private"]
"""util-linux ``unshare`` options of every isolated sandbox (``--net`` is added for policy ``none``)."""
PROBE_TIMEOUT_SECONDS = 10.0

logger = logging.getLogger(__name__)


class IsolatedSandboxConfig(BaseModel):
    """Settings of the isolated `local` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_timeout_seconds: float = 30.0
    """How long `start` waits for the sidecar to answer ready."""


class IsolatedSandbox(SidecarSandbox):
    """A local sandbox in its own namespaces, on an overlay of the host's root; see the module docstring.

    Args:
        task: the task; its ``environment/workspace/`` seeds the workspace, its
            ``environment.network`` chooses the network.
        run_id: the rollout's id, part of the folder's name.
        config: the backend's settings; default: `IsolatedSandboxConfig()`.
    """

    def __init__(self, task: Task, run_id: str, config: IsolatedSandboxConfig | None = None) -> None:
        self.task = task
        self.run_id = run_id
        self.config = config or IsolatedSandboxConfig()
        self.policy = task.spec.environment.network
        self.folder = Path(tempfile.mkdtemp(prefix=f"reroll-local-{run_id[:MAX_NAME_IN_ROOT]}-"))
        layout = SandboxLayout(
            root="/",
            workspace=_workspace(task),
            logs_dir=task.logs_mount,
            home=f"/home/{AGENT_USER}",
            agents_dir=str(cache_dir() / "agents"),
            agent_user=AGENT_USER,
        )
        super().__init__(layout, f"isolated local sandbox {self.folder}")
        self._address = private_loopback() if self.policy == "none" else "127.0.0.1"
        self._token = secrets.token_urlsafe(24)
        self._sidecar_process: ChildProcess | None = None
        self._init_pid: int | None = None
        self._forwarder: Forwarder | None = None
        self.limits = SandboxLimits.of(task.spec.environment)
        self._cgroup: SandboxCgroup | None = None
        self._hits_at_stop: list[str] = []

    @property
    def init_pid(self) -> int | None:
        """The host's pid of the sandbox's PID 1 while it runs (its namespaces are ``/proc/PID/ns/*``)."""
        return self._init_pid

    async def host_address(self) -> str:
        """``127.0.0.1`` for network ``full``; for ``none``, a loopback address of this sandbox's
        own: whatever listens on it when the sandbox starts is forwarded inside (`reroll.sandbox.netns`)."""
        return self._address

    async def allow_host_port(self, port: int) -> None:
        """``none``: forward the host's `port` on this sandbox's own address inside (the ports
        listening there at `start` already are). ``full``: a no-op, the host's network is shared.

        Raises:
            SandboxError: the forwarding socket could not be made in the namespace.
        """
        if self._forwarder is not None:
            try:
                await self._forwarder.forward_port(port)
            except OSError as exc:
                raise SandboxError(f"{self.label}: cannot forward port {port} inside: {exc}") from exc

    async def limits_hit(self) -> list[str]:
        """See `Sandbox.limits_hit`: the OOM kills and refused forks in the sandbox's cgroup, and
        whether its writable tmpfs (upper layer and ``/tmp``) or ``/dev/shm`` is full
        (`reroll.sandbox.cgroups`). Works after the sandbox's processes died; after `stop`, what
        was hit when it stopped."""
        if self._cgroup is None and self._init_pid is None:
            return list(self._hits_at_stop)
        hit = self._cgroup.limits_hit() if self._cgroup is not None else []
        if self._init_pid is not None:
            limits = self.limits
            hit += full_filesystems(
                Path(f"/proc/{self._init_pid}/root"),
                {
                    "/tmp": f"the writable layer and /tmp share {limits.writable_bytes >> 20} MiB: the "
                    f"task's environment.storage_mb ({limits.storage_mb} MiB), at most 3/4 of its "
                    "memory_mb as they are in RAM",
                    "/dev/shm": f"{limits.shm_bytes >> 20} MiB, counted in the task's environment.memory_mb",
                },
            )
        return hit

    @contextlib.asynccontextmanager
    async def egress(self) -> AsyncIterator[dict[str, str]]:
        """``full``: nothing to do. ``none``: an HTTP CONNECT proxy inside the sandbox's network
        namespace while the context lasts, named by the usual proxy variables."""
        if self._forwarder is None:
            yield {}
            return
        async with self._forwarder.connect_proxy() as url:
            yield {name: url for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}

    def _spec(self, control: Path) -> NamespaceSpec:
        verifier = self.layout.path(self.task.verifier_mount)
        agents = Path(self.layout.agents_dir)
        agents.mkdir(parents=True, exist_ok=True)
        return NamespaceSpec(
            state_dir=str(control),
            upper_size_bytes=self.limits.writable_bytes,
            shm_size_bytes=self.limits.shm_bytes,
            hostname=SANDBOX_HOSTNAME,
            network_namespace=self.policy == "none",
            agent_user=AGENT_USER,
            agent_owned=[self.layout.workspace, f"{self.layout.logs_dir}/agent"],
            agent_reachable=[
                str(Path(sys.executable).resolve().parent),  # the venv's interpreter
                str(Path(sys.base_prefix) / "bin"),  # the python3 first on the sandbox's PATH
                self.layout.agents_dir,
            ],
            binds=[
                Bind(str(self.folder / "app"), self.layout.workspace),
                Bind(str(self.folder / "logs"), self.layout.logs_dir),
                Bind(str(self.folder / "verifier"), verifier),
                Bind(str(agents), str(agents)),
                *_hidden_interpreter_binds(),
                Bind(str(control), str(control), mode=0o700),
            ],
        )

    async def start(self) -> None:
        """Lay out the folder, seed the workspace, start the namespaces and the sidecar in them,
        add the agent's user; for network ``none``, forward the proxy's ports in.

        Raises:
            SandboxError: the namespaces, the sidecar or the setup failed, or the sidecar did not
                answer ready within ``config.ready_timeout_seconds``; what was made is removed.
        """
        control = self.folder / ".reroll"
        for sub in ("app", "logs/agent", "logs/verifier", "verifier"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        control.mkdir(mode=0o700)
        if self.task.workspace_seed_dir is not None:
            shutil.copytree(
                self.task.workspace_seed_dir, self.folder / "app", dirs_exist_ok=True, symlinks=True
            )
        socket_path, token_file = control / "sidecar.sock", control / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._token)
        python = sys.executable
        unshare = [*UNSHARE_FLAGS, *(["--net"] if self.policy == "none" else [])]
        init = [python, "-m", "reroll.sandbox.namespace_init", self._spec(control).to_json(), "--"]
        command = ["unshare", *unshare, "--", *init, python, "-m", "reroll_sidecar"]
        try:
            self._cgroup = SandboxCgroup.create(self.folder.name, self.limits)
            command = self._cgroup.enter_command(command)
        except CgroupError as exc:
            _warn_unlimited_once(str(exc))
        self._sidecar_process = ChildProcess(
            "reroll_sidecar",
            [
                "--listen",
                f"unix:{socket_path}",
                "--state-dir",
                str(control / "state"),
                "--token-file",
                str(token_file),
            ],
            workdir=control,
            name="sidecar",
            env=child_environment({"TMPDIR": "/tmp"}),  # the sandbox's own /tmp, whatever the controller's
            command=command,
        )
        try:
            await self._sidecar_process.start(self.config.ready_timeout_seconds)
            self._init_pid = _child_of(self._sidecar_process.pid)
            client = await self._connect(f"unix:{socket_path}", self._token)
            await client.wait_ready(timeout_seconds=self.config.ready_timeout_seconds)
            if self.policy == "none":
                self._forwarder = Forwarder(f"/proc/{self._init_pid}/ns/net", self._address)
                await self._forwarder.forward_host_ports()
        except (RerollError, OSError) as exc:
            await self.stop()
            raise SandboxError(f"{self.label}: did not start: {exc}") from exc
        finally:
            token_file.unlink(missing_ok=True)

    async def stop(self) -> None:
        """Kill the sandbox's processes (its PID 1: the kernel ends the rest), stop the forwarding
        and delete the folder (and the cgroup, killing what is left in it). Safe to call twice."""
        if self._cgroup is not None or self._init_pid is not None:
            self._hits_at_stop = await self.limits_hit()
        if self.connected:
            with contextlib.suppress(SidecarError):
                await self.kill()
        await self.disconnect()
        if self._forwarder is not None:
            await self._forwarder.close()
            self._forwarder = None
        if self._init_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)
            self._init_pid = None
        if self._sidecar_process is not None:
            await self._sidecar_process.stop()
            self._sidecar_process = None
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.remove)  # kills what is left in it
            self._cgroup = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _hidden_interpreter_binds() -> list[Bind]:
    """Read-only binds of the controller's virtualenv and base Python at their own paths where
    the sandbox's private ``/tmp`` or ``/run`` would hide them (a venv made under ``/tmp``)."""
    private = (Path("/tmp"), Path("/run"))
    prefixes = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    return [
        Bind(str(prefix), str(prefix), read_only=True)
        for prefix in sorted(prefixes)
        if any(folder in prefix.parents for folder in private)
    ]


def _workspace(task: Task) -> str:
    """The task's working folder (``workdir``, else `DEFAULT_WORKDIR`), unless binding the
    sandbox's folder there would hide host files the sandbox runs from (the interpreter, its
    virtualenv, reroll's cache: ``workdir = "/root"`` with Python under ``/root/.pyenv``); then
    `DEFAULT_WORKDIR`. Task scripts that read ``$REROLL_WORKSPACE`` run either way."""
    wanted = Path(task.workdir or DEFAULT_WORKDIR)
    needed = (Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve(), cache_dir())
    if any(path == wanted or wanted in path.parents for path in needed):
        return DEFAULT_WORKDIR
    return str(wanted)


def _child_of(pid: int | None) -> int:
    """The one child of process `pid` (``unshare --fork``'s: the sandbox's PID 1), by its host pid.

    Raises:
        SandboxError: `pid` has no child (it exited).
    """
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    if not children:
        raise SandboxError(f"unshare (pid {pid}) has no child: the sandbox's PID 1 is gone")
    return int(children[0])


@functools.cache
def namespaces_unavailable() -> str:
    """Why this machine cannot run an isolated sandbox (empty when it can): runs a tiny one."""
    if shutil.which("unshare") is None:
        return "util-linux unshare is not installed"
    probe = [
        "unshare",
        *UNSHARE_FLAGS,
        "--net",
        "--",
        "sh",
        "-c",
        "d=$(mktemp -d) && mkdir $d/u $d/w $d/m && mount -t tmpfs t $d/u && mkdir $d/u/u $d/u/w "
        "&& mount -t overlay o -o lowerdir=/,upperdir=$d/u/u,workdir=$d/u/w $d/m; r=$?; "
        "umount -l $d/m $d/u 2>/dev/null; rm -rf $d; exit $r",
    ]
    try:
        done = subprocess.run(
            probe, capture_output=True, text=True, timeout=PROBE_TIMEOUT_SECONDS, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def local_sandbox(task: Task, run_id: str) -> Sandbox:
    """The `local` backend: an `IsolatedSandbox`, or where this machine forbids namespaces (or
    overlayfs), the plain `LocalSandbox` — said once per process on stderr, as a warning.

    Raises:
        SandboxError: the plain fallback cannot honour network ``none``.
    """
    reason = namespaces_unavailable()
    if not reason:
        return IsolatedSandbox(task, run_id)
    if task.spec.environment.network == "none":
        raise SandboxError(
            "network none needs the isolated local sandbox (or docker), "
            f"and this machine forbids it: {reason}"
        )
    _warn_plain_once(reason)
    return LocalSandbox(task, run_id)


@functools.cache
def _warn_unlimited_once(reason: str) -> None:
    message = (
        f"reroll: the local sandbox's cgroup cannot be made here ({reason}); its processes run "
        "without the task's memory, cpus and pids limits"
    )
    print(message, file=sys.stderr)
    logger.warning(message)


@functools.cache
def _warn_plain_once(reason: str) -> None:
    message = (
        f"reroll: the local sandbox cannot isolate here ({reason}); running task and agent as plain "
        "host processes (--sandbox local-plain), which can change this machine"
    )
    print(message, file=sys.stderr)
    logger.warning(message)
