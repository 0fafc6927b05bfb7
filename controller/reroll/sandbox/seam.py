"""What a backend may offer beyond `reroll.sandbox.base.Sandbox`, and the types it constructs or
returns for it: the seam between the backends and the planes above them.

- `SharedInstalls` (the installs plane, `reroll.installs`): a backend whose installs are shared by
  its sandboxes names where they live on the host (`InstallFolders`; ``local`` backends:
  `local_install_folders`) and makes an installer sandbox.
- `SiblingServices` (the environment plane, `reroll.environment.services`): a backend that runs
  a task's image services as containers beside the sandbox starts them by name and hands back a
  `ServiceProcess`.
- `PhaseAllowList` (the verify's network, `reroll.rollout.verify.phase_network`): a backend that
  enforces allow-lists switches the sandbox to another phase's list.

The planes import this module; no backend imports a plane.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from reroll.cache import cache_dir
from reroll.sandbox.base import Sandbox


@dataclass(frozen=True)
class InstallFolders:
    """Where a backend's shared installs live on the host: one folder per unit, and their
    manifests (`reroll.installs.store.InstallStore` checks, records and discards them)."""

    folder: Path
    """The host folder every sandbox sees as its agents folder (read-only but in an installer)."""
    manifests: Path
    """The host folder of the manifests and lock files, seen by no sandbox."""


def local_install_folders() -> InstallFolders:
    """The installs of the ``local`` backends: ``<cache>/agents``, manifests in
    ``<cache>/install-manifests``."""
    return InstallFolders(folder=cache_dir() / "agents", manifests=cache_dir() / "install-manifests")


@runtime_checkable
class SharedInstalls(Protocol):
    """A sandbox backend whose installs are shared by its sandboxes, read-only to each rollout."""

    async def install_store(self) -> InstallFolders:
        """Where the installs live on the host (the sandbox's ``layout.agents_dir``), made when missing.

        Raises:
            SandboxError: the store cannot be made or read from the host.
        """
        ...

    def installer(self) -> contextlib.AbstractAsyncContextManager[Sandbox]:
        """A started sandbox like this one (the same image and layout) in which the store is
        writable, stopped when the context ends; for installs only: nothing of the task or the
        agent runs in it.

        Raises:
            SandboxError: it could not start.
        """
        ...


class ServiceProcess(Protocol):
    """A running service, whichever way it runs."""

    async def exit_code(self) -> int | None:
        """Its exit code once it exited (negative: the signal), None while it runs."""
        ...

    async def run_command(self, command: str, timeout_seconds: float) -> tuple[bool, str]:
        """Run the shell `command` where the service runs (in the sandbox, or in its own
        container), as root, within `timeout_seconds`: (exited 0, its output's end). Its
        health checks use it; so may the state's snapshot and query commands."""
        ...

    async def output(self) -> bytes:
        """Its output so far (a sibling's: its container's log)."""
        ...

    async def stop(self) -> None:
        """Stop it and remove what it left (a sibling's container). Safe to call twice."""
        ...


@runtime_checkable
class SiblingServices(Protocol):
    """A sandbox backend that runs image services as sibling containers (the docker backend)."""

    async def start_sibling(self, name: str, env: Mapping[str, str]) -> ServiceProcess:
        """Start the sandbox spec's sibling service `name` (it has an ``image`` or a ``build``,
        built when the sandbox started) on the sandbox's network, reachable by its name,
        under the sandbox's limits and labels, with `env` as its environment.

        Raises:
            TaskEnvironmentError: its image is missing and cannot be pulled.
            SandboxError: the engine failed to start it.
        """
        ...

    async def image_command(self) -> list[str]:
        """The sandbox image's own ENTRYPOINT followed by its CMD (empty when it has neither)."""
        ...


@runtime_checkable
class PhaseAllowList(Protocol):
    """A sandbox backend that enforces a phase's allow-list (`reroll.sandbox.spec.SandboxSpec.allowed`)
    and switches to another phase's for a while."""

    def allow_only(
        self, hosts: tuple[str, ...] | None
    ) -> contextlib.AbstractAsyncContextManager[dict[str, str]]:
        """While inside, the sandbox reaches only `hosts` (resolved on the host on entry,
        `reroll.sandbox.allowlist.resolve`; None: everything) beyond the host ports it is allowed;
        on exit, the agent phase's list again.

        Yields:
            Environment the phase's processes need to use that access (proxy variables).

        Raises:
            SandboxError: the sandbox did not start with `SandboxSpec.listed`, or its firewall failed.
        """
        ...
