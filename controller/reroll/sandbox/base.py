"""The `Sandbox` protocol every backend implements, and the lazy registry of backends.

A backend's only job is the sandbox's lifecycle: create it, start the sidecar inside it, hand out
a connected `SidecarClient`, and tear everything down. Everything the controller does inside a
sandbox (exec, files, kill, verify) then goes through that client, whatever the backend.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reroll.errors import SandboxError
from reroll.sandbox.sidecar_client import SidecarClient
from reroll.tasks import Task


@dataclass(frozen=True)
class SandboxLayout:
    """Where things live inside a sandbox, as paths its processes see.

    A container uses the usual absolute paths (``/app``, ``/logs``); the `local` backend puts
    them under its root folder. Processes find them in the environment from `env()`.
    """

    root: str
    """The sandbox root: ``/`` in a container, a private folder for `local`."""
    workspace: str
    """The agent's working directory (``/app``)."""
    logs_dir: str
    """Holds ``agent/`` and ``verifier/`` (``/logs``); the verifier writes ``verifier/reward.txt``."""
    home: str
    """HOME of the agent's processes."""
    agents_dir: str
    """Where agents are installed, one folder per install key, kept across rollouts."""
    agent_user: str = ""
    """The user the agent runs as (``agent`` in containers); empty = the sidecar's own user."""

    def path(self, relative: str) -> str:
        """A path under the sandbox root, e.g. ``path("verifier")`` → ``/verifier``."""
        return str(Path(self.root) / relative.lstrip("/"))

    def env(self) -> dict[str, str]:
        """Environment variables every process in the sandbox gets."""
        return {
            "HOME": self.home,
            "REROLL_SANDBOX_ROOT": self.root,
            "REROLL_WORKSPACE": self.workspace,
            "REROLL_LOGS_DIR": self.logs_dir,
        }


class Sandbox(Protocol):
    """A sandbox backend: one isolated place where one rollout's agent and verifier run.

    Use as an async context manager (``async with backend(...) as sandbox``), or call `start` and
    `stop` explicitly; `stop` must run even when the rollout failed. Never rely on finalisers.
    """

    layout: SandboxLayout
    """Paths inside the sandbox."""

    @property
    def client(self) -> SidecarClient:
        """The connected sidecar client. Raises SandboxError before `start`."""
        ...

    async def host_address(self) -> str:
        """The host address the sandbox's processes reach the host at; the LLM proxy listens there.

        Callable before `start`. ``127.0.0.1`` for `local`; the network's gateway for containers.

        Raises:
            SandboxError: the backend's network cannot be set up.
        """
        ...

    def egress(self) -> contextlib.AbstractAsyncContextManager[dict[str, str]]:
        """Inside this context the sandbox may reach the internet (to install agents), whatever
        the task's network policy; outside it the policy holds again.

        Yields:
            Environment variables an installer needs to use that access (e.g. a CA bundle).
        """
        ...

    async def start(self) -> None:
        """Create the sandbox, start its sidecar and wait until it is ready.

        Raises:
            SandboxError: the sandbox or its sidecar could not start (the cause is in the message).
        """
        ...

    async def stop(self) -> None:
        """Stop every process of the sandbox and delete it. Safe to call twice or after a failed start."""
        ...

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """Save `paths` (absolute, in the sandbox; default: the workspace) as snapshot `name`.

        Returns:
            The snapshot's size in bytes.

        Raises:
            SidecarError: a bad name or path, or the sidecar failed to store it.
        """
        ...

    async def restore(self, name: str) -> list[str]:
        """Restore snapshot `name` exactly: contents, modes, symlinks, and deletions of what came since.

        Returns:
            The paths restored.

        Raises:
            SidecarError: no snapshot of that name, or the sidecar failed to restore it.
        """
        ...


class SidecarSandbox:
    """What every backend shares once its sidecar runs (snapshots); backends subclass it."""

    layout: SandboxLayout

    @property
    def client(self) -> SidecarClient:
        """The connected sidecar client; each backend provides it."""
        raise NotImplementedError

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """See `Sandbox.snapshot`."""
        return await self.client.snapshot(name, paths or [self.layout.workspace])

    async def restore(self, name: str) -> list[str]:
        """See `Sandbox.restore`."""
        return await self.client.restore(name)


BACKENDS: dict[str, str] = {
    "local": "reroll.sandbox.local:LocalSandbox",
    "docker": "reroll.sandbox.docker:DockerSandbox",
}
"""Backend name → ``module:class``, imported only when used."""
WITHOUT_NETWORK_POLICY = frozenset({"local"})
"""Backends that run on the host's network and enforce no ``environment.network`` policy."""


def create_sandbox(backend: str, task: Task, run_id: str) -> Sandbox:
    """Create (not start) a sandbox of the named backend for `task`.

    Args:
        backend: a key of `BACKENDS`.
        task: the task whose environment the sandbox provides.
        run_id: an id unique to this rollout, used to label what the sandbox creates.

    Raises:
        SandboxError: unknown backend name (the message lists the known ones), or its module
            could not be imported (the message says what to install).
    """
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise SandboxError(
            f"unknown sandbox backend {backend!r}; known: {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SandboxError(f"sandbox backend {backend!r} needs a missing package: {exc}") from exc
    sandbox: Sandbox = getattr(module, class_name)(task, run_id)
    return sandbox
