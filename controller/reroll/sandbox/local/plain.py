"""The `local` sandbox backend: a private folder on the host and a sidecar child process.

No isolation beyond a separate working tree, HOME and process group: meant for trusted agents,
tests and the embedded demo, where no container engine is needed. Still, nothing secret is in an
environment the agent can read (`reroll_contracts.childenv`): the sidecar, whose environment the agent
inherits, gets a minimal one and its token through a 0600 file deleted once it is ready; the
controller and the proxy make their ``/proc/PID/environ`` unreadable to the agent's user.

The sandbox paths live under the root folder (``<root>/app`` — the task's ``workdir`` below the
root, ``<root>/logs``, ``<root>/tests`` or ``<root>/verifier``), so task scripts
that run here read them from ``$REROLL_WORKSPACE`` and ``$REROLL_LOGS_DIR`` (falling back to
``/app`` and ``/logs`` in containers). The workspace starts as a copy of the task's
``environment/workspace/``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict
from reroll_contracts.childenv import child_environment, hide_from_same_user
from reroll_contracts.errors import RerollError, SandboxError, SidecarError
from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR

from reroll.cache import cache_dir
from reroll.host.child_process import ChildProcess
from reroll.sandbox.base import Sandbox
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.seam import InstallFolders, local_install_folders
from reroll.sandbox.spec import SandboxSpec

MAX_NAME_IN_ROOT = 32
"""How much of the run id goes into the sandbox folder's name: the sidecar's Unix socket lives
below it, and a socket path may hold at most 107 bytes (sockaddr_un)."""


class LocalSandboxConfig(BaseModel):
    """Settings of the `local` backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ready_timeout_seconds: float = 30.0
    """How long `start` waits for the sidecar to answer ready."""


class LocalSandbox(Sandbox):
    """A sandbox in a temporary host folder; see the module docstring.

    Args:
        spec: what to make (`reroll.sandbox.spec.SandboxSpec`); its ``workspace_seed`` seeds the
            workspace.
        run_id: the rollout's id, part of the folder's name.
        config: the backend's settings; default: `LocalSandboxConfig()`.
    """

    config_model: ClassVar[type[LocalSandboxConfig]] = LocalSandboxConfig
    """The model of the backend's settings (`reroll.sandbox.base.Backend`)."""
    sidecar_program: ClassVar[tuple[str, ...]] = (sys.executable, "-m", "reroll_sidecar")
    """The sidecar runs from the controller's interpreter here (no bundle)."""

    @classmethod
    def prune(
        cls, config: BaseModel, run_id: str | None = None, *, running: bool = False
    ) -> dict[str, list[str]]:
        """Nothing to sweep: a local sandbox's processes end with its controller's sidecar
        (`stop` kills any orphan); a folder a killed controller left in the temporary folder
        (``reroll-local-*``) is not removed, as it cannot be told from a live one.

        Returns:
            An empty report.
        """
        return {}

    def __init__(self, spec: SandboxSpec, run_id: str, config: LocalSandboxConfig | None = None) -> None:
        self.spec = spec
        self.run_id = run_id
        self.config = config or LocalSandboxConfig()
        self.root = Path(tempfile.mkdtemp(prefix=f"reroll-local-{run_id[:MAX_NAME_IN_ROOT]}-"))
        layout = SandboxLayout(  # the task's working folder, below the root: /root → <root>/root
            root=str(self.root),
            workspace=str(self.root / (spec.workdir or DEFAULT_WORKDIR).lstrip("/")),
            logs_dir=str(self.root / "logs"),
            home=str(self.root / "home"),
            agents_dir=str(cache_dir() / "agents"),
        )
        super().__init__(layout, f"local sandbox {self.root}")
        self._token = secrets.token_urlsafe(24)
        self._sidecar_process: ChildProcess | None = None

    async def host_address(self) -> str:
        """Loopback: the sandbox's processes run on the host."""
        return "127.0.0.1"

    async def allow_host_port(self, port: int) -> None:
        """A no-op: the sandbox's processes reach every port of the host."""

    async def limits_hit(self) -> list[str]:
        """None: the local sandbox enforces no resource limits."""
        return []

    async def install_store(self) -> InstallFolders:
        """See `reroll.sandbox.seam.SharedInstalls`: `local_install_folders` (checked before
        each use; this backend does not stop the agent, our own user, from writing there)."""
        return local_install_folders()

    @contextlib.asynccontextmanager
    async def installer(self) -> AsyncIterator[LocalSandbox]:
        """See `reroll.sandbox.seam.SharedInstalls`: this sandbox itself (it isolates nothing)."""
        yield self

    @contextlib.asynccontextmanager
    async def egress(self) -> AsyncIterator[dict[str, str]]:
        """A no-op: the local sandbox has the host's network and trusts what the host trusts."""
        yield {}

    async def start(self) -> None:
        """Lay out the folders, seed the workspace, start the sidecar and wait until it is ready.

        Raises:
            SandboxError: the sidecar did not start or answer ready within
                ``config.ready_timeout_seconds``.
        """
        for sub in (self.layout.workspace, "logs/agent", "logs/verifier", "home", "tmp", ".reroll"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if self.spec.workspace_seed is not None:
            shutil.copytree(
                self.spec.workspace_seed, self.layout.workspace, dirs_exist_ok=True, symlinks=True
            )
        hide_from_same_user()  # the agent runs as our user: our environment holds provider keys
        socket_path = self.root / ".reroll" / "sidecar.sock"
        token_file = self.root / ".reroll" / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self._token)
        self._sidecar_process = ChildProcess(
            "reroll_sidecar",
            [
                "--listen",
                f"unix:{socket_path}",
                "--state-dir",
                str(self.root / ".reroll" / "state"),
                "--token-file",
                str(token_file),
            ],
            workdir=self.root / ".reroll",
            name="sidecar",
            env=child_environment({"TMPDIR": str(self.root / "tmp")}),  # the agent inherits it
        )
        try:
            await self._sidecar_process.start()
            await self.connect(f"unix:{socket_path}", self._token)
            await self.wait_ready(timeout_seconds=self.config.ready_timeout_seconds)
        except RerollError as exc:
            await self.stop()
            raise SandboxError(f"{self.label}: sidecar did not start: {exc}") from exc
        finally:
            token_file.unlink(missing_ok=True)  # read by now (or never needed): before any agent runs

    async def stop(self) -> None:
        """Kill the sandbox's processes, stop the sidecar and delete the folder."""
        if self.connected:
            # A dead sidecar cannot kill; its process groups are then gone or orphaned already.
            with contextlib.suppress(SidecarError):
                await self.kill()
        await self.disconnect()
        if self._sidecar_process is not None:
            await self._sidecar_process.stop()
            self._sidecar_process = None
        kill_sandbox_processes(self.layout.root)
        shutil.rmtree(self.root, ignore_errors=True)


def kill_sandbox_processes(root: str) -> None:
    """SIGKILL every process still running in the local sandbox at `root` (e.g. orphaned by a
    dead sidecar, or left by a killed controller).

    Every process started in a local sandbox carries ``REROLL_SANDBOX_ROOT=<root>`` in its
    environment; after a dead sidecar its process groups are orphaned and found that way.
    Processes of other users (unreadable environment) are skipped.
    """
    marker = f"REROLL_SANDBOX_ROOT={root}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # exited meanwhile, or not ours
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
