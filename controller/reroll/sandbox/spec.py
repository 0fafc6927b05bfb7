"""What a backend is told about the sandbox to make: `SandboxSpec`, the one argument of ``create``
besides the run id and the backend's settings.

A backend never sees the task: `reroll.rollout.sandbox_spec.sandbox_spec` builds the spec from a
loaded task in one place, and every backend (`local`, `local-plain`, `docker`, one outside reroll)
reads only these fields. Paths are host paths unless a field says "in the sandbox".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.network import NetworkPolicy
from reroll_contracts.sandbox_paths import LOGS_MOUNT


@dataclass(frozen=True)
class ResourceLimits:
    """What the sandbox's processes may use (the task's ``environment`` section's limits)."""

    cpus: float = 1.0
    """CPU time, in cores."""
    memory_mb: int = 2048
    """RAM plus swap (none beyond it), in MiB."""
    pids_max: int = 1024
    """Processes and threads at once."""
    storage_mb: int = 10240
    """The size of what the sandbox writes (its writable file system), in MiB."""


@dataclass(frozen=True)
class ImageBuild:
    """A Dockerfile and the folder sent to its build (docker only)."""

    context: Path
    """The build context: a host folder, copied, never written to."""
    dockerfile: Path
    """The Dockerfile: a host file, usually inside `context`."""
    hidden: frozenset[str] = frozenset()
    """Top-level folders of `context` the image must not see: left out of the copy, and the
    Dockerfile's COPY / ADD lines whose every source is one of them dropped."""


@dataclass(frozen=True)
class SiblingService:
    """A service that runs in a container of its own beside the sandbox (docker's sibling
    containers), reachable on the sandbox's network by its `name`."""

    name: str
    """Its name: a DNS label, its host name on the sandbox's network."""
    image: str | None = None
    """The image it runs, when it is not built (`build`)."""
    build: ImageBuild | None = None
    """The image built for it; wins over `image`."""
    command: str | None = None
    """A shell line that replaces the image's command; None: the image's own."""
    workdir: str | None = None
    """The folder (absolute, in its container) the command runs in; None: the image's."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to make one rollout's sandbox.

    Built from a task by `reroll.rollout.sandbox_spec.sandbox_spec`; frozen, so a backend that
    makes a helper sandbox of the same kind (an install sandbox) hands it on unchanged.
    """

    name: str
    """The task's name: in image tags and error messages."""
    network: NetworkPolicy = "full"
    """Egress policy: ``none`` lets the sandbox reach only the host ports it is allowed
    (`reroll.sandbox.base.Sandbox.allow_host_port`)."""
    allowed: tuple[str, ...] = ()
    """Under ``none``, what the sandbox reaches beyond those ports (the agent phase's allow-list,
    `reroll_contracts.network.AllowedHosts`); enforced by backends offering
    `reroll.sandbox.seam.PhaseAllowList`."""
    denied: tuple[str, ...] = ()
    """Hostnames the agent phase may not reach beyond `allowed` (a deny list,
    `reroll_contracts.network.PhaseNetworks.agent_denied`): their addresses, resolved on the host
    when the sandbox starts, are refused even where `allowed` holds them; a name (or a subdomain
    of one) is refused by a proxy that sees it."""
    listed: bool = False
    """A phase of the rollout has an allow-list (`reroll_contracts.network.PhaseNetworks.filtered`):
    the sandbox starts where one can be applied and changed (`reroll.sandbox.seam.PhaseAllowList`)."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    """cpus, memory, pids and storage (enforced by `local` and `docker`, not by `local-plain`)."""
    workdir: str | None = None
    """The agent's working folder in the sandbox (absolute); None: the image's WORKDIR, else
    `reroll_contracts.sandbox_paths.DEFAULT_WORKDIR`."""
    logs_mount: str = LOGS_MOUNT
    """The folder in the sandbox that holds ``agent/`` and ``verifier/`` (the reward file)."""
    verifier_mount: str = "/verifier"
    """Where the verifier's folder goes in the sandbox at verify time (``/verifier`` or ``/tests``)."""
    agent_user: str | None = None
    """The user the agent runs as; None: the image's USER (root when unset)."""
    workspace_seed: Path | None = None
    """A host folder whose content seeds the workspace (copied in at start); None: it starts
    empty (docker: as the image has it)."""
    build: ImageBuild | None = None
    """The sandbox image's Dockerfile (docker); None: `docker_image`, else reroll's base image."""
    docker_image: str | None = None
    """A prebuilt image to run when there is no `build` (docker)."""
    build_timeout_seconds: float = 600.0
    """How long building `build` (and each sibling's build) may take, in seconds (docker)."""
    siblings: tuple[SiblingService, ...] = ()
    """The services that run in containers of their own (docker); started by
    ``start_sibling`` once the sandbox runs."""

    def sibling(self, name: str) -> SiblingService:
        """The sibling service called `name`.

        Raises:
            KeyError: the spec has none of that name.
        """
        for service in self.siblings:
            if service.name == name:
                return service
        raise KeyError(f"sandbox spec {self.name}: no sibling service {name!r}")
