"""The environment plane of a task: its services, their readiness, its MCP servers and the state
that snapshots and restores (DESIGN.md, "The environment plane"; seeds/architecture.txt, "The
Environment plane & the manifest").

These models are the fields of `reroll.tasks.spec.EnvironmentSection` that describe the world the
agent acts in, in BenchFlow's spelling:

- BenchFlow's environment-plane manifest (``environment.toml``; ``benchflow.environment.manifest``
  in ``src/benchflow/environment/manifest.py`` and ``docs/environment-plane.md``, read in November
  2026): ``owns_lifecycle``, ``[environment.task_selection]``, ``[environment.readiness]``,
  ``[environment.forward_env]``, ``[environment.state]``, ``[[environment.services]]`` with
  ``name`` / ``command`` / ``port`` / ``health_path``;
- the same fields inline in task.toml (``[environment]``) or task.md front matter (``sandbox:`` /
  ``environment:``), plus what a service needs beyond the manifest's four fields: an ``image``
  (a sibling container on docker), ``env``, ``depends_on`` and a ``health`` check (a command or an
  HTTP probe, with Docker HEALTHCHECK's interval, timeout, start period and retries);
- benchflow's task-level ``healthcheck`` (``HealthcheckConfig``) and ``mcp_servers``
  (``MCPServerConfig``, ``src/benchflow/task/config.py``).

Harbor's ``environment/docker-compose.yaml`` is not a field: `reroll.tasks.task.Task.compose_file`
finds it. What runs these declarations is the sandbox backends' business; this module only says
what was asked, validated.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SERVICE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
"""A service's name: a DNS label (it is the service's host name on docker's private network)."""


class HealthCheck(BaseModel):
    """How the framework decides a service (or the whole environment) is healthy: a command that
    exits 0, or an HTTP GET that answers 2xx — exactly one of them. Timing as Docker's HEALTHCHECK
    (and benchflow's ``HealthcheckConfig``), in seconds."""

    model_config = ConfigDict(extra="forbid")
    command: str | None = None
    """A shell command run inside the sandbox (as root on the root side, never as the agent);
    healthy when it exits 0."""
    http: str | None = None
    """A URL (``http://localhost:9001/health``) or a path (``/health``) on the service's `port`;
    healthy when a GET answers 2xx."""
    interval_sec: float = Field(default=1.0, gt=0)
    """Seconds between probes."""
    timeout_sec: float = Field(default=5.0, gt=0)
    """Seconds one probe may take before it counts as failed."""
    start_period_sec: float = Field(default=0.0, ge=0)
    """Seconds after the start during which failed probes are not counted (the service boots)."""
    retries: int = Field(default=3, ge=1)
    """Consecutive failed probes after the service was healthy that mark it unhealthy (Docker's
    meaning; reroll's readiness gate waits for the first pass and probes nothing after it yet: a
    service that exits is what counts as a crash, `reroll.environment.services`)."""

    def describe(self) -> str:
        """The probe and its timing as a phrase (``GET /health (every 1 s, 3 retries)``)."""
        probe = f"GET {self.http}" if self.http else f"`{self.command}` exits 0"
        return f"{probe} (every {self.interval_sec:g} s, {self.retries} retries)"

    @model_validator(mode="after")
    def _one_probe(self) -> HealthCheck:
        if (self.command is None) == (self.http is None):
            raise ValueError("a health check has exactly one of 'command' and 'http'")
        return self


class ImageBuild(BaseModel):
    """How an image is built from a Dockerfile (compose's ``build``: its ``context`` and
    ``dockerfile``), on the docker backend only; built once per content (the tag carries a hash of
    the Dockerfile and every file of the context, `reroll.sandbox.docker.images`)."""

    model_config = ConfigDict(extra="forbid")
    context: str
    """The build context, a folder on the host: absolute, or relative to the task's folder (a
    compose file's relative contexts are made absolute when it is read, from its own folder)."""
    dockerfile: str = "Dockerfile"
    """The Dockerfile, relative to `context`."""

    @field_validator("dockerfile")
    @classmethod
    def _inside_context(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError(f"dockerfile {value!r} must be a relative path inside the build context")
        return value


class ServiceSpec(BaseModel):
    """One service the framework starts for a rollout (``[[environment.services]]``).

    On docker a service with an `image` or a `build` is a sibling container on the rollout's
    private network, reachable by its `name`; a service with only a `command` runs inside the
    sandbox (both backends), as root's side of the sandbox, never as the agent's user.
    """

    model_config = ConfigDict(extra="forbid")
    name: str
    """Its name: unique in the task, a DNS label."""
    command: str | None = None
    """The start command (a shell line); with an `image`, it replaces the image's command."""
    image: str | None = None
    """An image to run the service in, as a sibling container (docker only)."""
    build: ImageBuild | None = None
    """An image built for the service (compose's ``build``), run as `image` is; it wins over `image`."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """The port it listens on (TCP)."""
    health_path: str = "/health"
    """The HTTP path probed on `port` when no `health` is given (benchflow's manifest field)."""
    health: HealthCheck | None = None
    """Its readiness probe; None: an HTTP GET of `health_path` on `port` when it has a port, else
    ready as soon as it runs."""
    env: dict[str, str] = {}
    """Extra environment of the service."""
    depends_on: list[str] = []
    """Services that must be healthy before this one starts (compose's ``depends_on``)."""
    workdir: str | None = None
    """The folder the command runs in (absolute); None: the sandbox's working folder."""
    if_installed: bool = False
    """Start it only when its command's program runs in this sandbox (``PROGRAM --help`` exits
    0, PROGRAM the command's first word, after ``exec``), else skip it: what BenchFlow does with a manifest's
    services, since one manifest serves per-task images that each carry a subset of them
    (``ManifestEnvironment.provision``). True for the command services an environment manifest
    declares (`reroll.tasks.manifest.apply_manifest`); when every such service is skipped, the
    rollout ends ``environment_error``."""

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not SERVICE_NAME.fullmatch(value):
            raise ValueError(f"service name {value!r} must be a lowercase DNS label (a-z, 0-9, _ . -)")
        return value

    @property
    def sibling(self) -> bool:
        """Whether it runs in a container of its own (it has an `image` or a `build`), not in the sandbox."""
        return self.image is not None or self.build is not None

    @property
    def probe(self) -> HealthCheck | None:
        """Its readiness probe: `health`, else a GET of `health_path` on `port` (benchflow's
        derived probe), else None (ready as soon as it runs)."""
        if self.health is not None:
            return self.health
        return HealthCheck(http=self.health_path) if self.port is not None else None

    def describe_probe(self) -> str:
        """`probe` as a phrase, a path shown on the host the service is reached at."""
        probe = self.probe
        if probe is None:
            return "running"
        if probe.http and probe.http.startswith("/"):
            host = self.name if self.sibling else "localhost"
            probe = probe.model_copy(update={"http": f"http://{host}:{self.port}{probe.http}"})
        return probe.describe()

    @model_validator(mode="after")
    def _runs_something(self) -> ServiceSpec:
        if self.command is None and not self.sibling:
            raise ValueError(f"service {self.name!r} has neither 'command' nor 'image' nor 'build'")
        return self


class SetupCommand(BaseModel):
    """One of ``environment.setup_commands`` (BenchFlow's ``SetupCommandConfig``): a shell line run
    in the sandbox once its services are ready and before the agent starts, to seed the
    workspace or a database; one that fails ends the rollout as ``environment_error``."""

    model_config = ConfigDict(extra="forbid")
    command: str = Field(min_length=1)
    """The shell line (``sh -c``)."""
    timeout_sec: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """Seconds it may take; past them its process group is killed and the rollout ends."""
    cwd: str | None = None
    """Its working folder (absolute); None: the sandbox's working folder."""
    env: dict[str, str] = {}
    """Extra environment (``${VAR}`` / ``${VAR:-default}`` of the host resolved, as ``environment.env``)."""
    user: str | int | None = None
    """The user it runs as; None: the sandbox's own (root's side)."""
    service: str = "main"
    """Where it runs: ``main``, the sandbox (the only one reroll runs setup commands in)."""
    host_lock: str | None = None
    """A name: setup commands with the same one run one at a time on this host, across rollouts."""
    capture_dir: str | None = None
    """BenchFlow archives this folder into a host variable after the command, for later tasks;
    reroll does not (a rollout never writes to the host's environment): said on the console."""
    capture_dir_b64_env: str | None = None
    """See `capture_dir`."""
    capture_dir_b64_env_file_var: str | None = None
    """See `capture_dir`."""

    @field_validator("service")
    @classmethod
    def _in_the_sandbox(cls, value: str) -> str:
        if value != "main":
            raise ValueError(f"service {value!r}: reroll runs setup commands in the sandbox (main) only")
        return value


class Readiness(BaseModel):
    """``[environment.readiness]``: what the agent waits for, beyond each service's own probe
    (benchflow's manifest; its probes run inside the sandbox)."""

    model_config = ConfigDict(extra="forbid")
    http: list[str] = []
    """URLs that must answer 2xx."""
    tcp: list[int] = []
    """Ports on localhost that must accept a connection."""
    timeout_sec: float = Field(default=120.0, gt=0)
    """Seconds from the environment's start within which every service and probe must be healthy;
    past it the rollout ends as ``environment_error``."""


class TaskSelection(BaseModel):
    """``[environment.task_selection]``: how an image that serves many tasks learns which one to
    load (benchflow's manifest): ``image`` — the task's data is baked into its image; ``env_var`` —
    the task's name is passed in the variable `key`."""

    model_config = ConfigDict(extra="forbid")
    mechanism: Literal["image", "env_var"] = "env_var"
    key: str = "BENCHFLOW_TASK_ID"
    """The variable that carries the task's name (``mechanism = "env_var"``)."""
    inject_into: Literal["entrypoint", "exec"] = "entrypoint"
    """``entrypoint``: set for the container's first process (its services see it); ``exec``: only
    for the processes reroll starts in it."""


class StateSpec(BaseModel):
    """``[environment.state]``: the environment's state that a snapshot captures and a restore puts
    back. Absent, the environment is stateless (a branch by snapshot captures only the sandbox's
    files and the agent's session).

    Kinds: ``sqlite`` — database files, copied through SQLite's online backup API (benchflow's only
    kind); ``files`` — data folders or files, copied whole; ``command`` — anything else: a
    `snapshot_command` that writes the state to ``$REROLL_STATE_DIR`` and a `restore_command` that
    reads it back.
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["sqlite", "files", "command"] = "sqlite"
    paths: list[str] = []
    """Absolute paths in the sandbox (or in the `service`'s container): the databases (``sqlite``)
    or files and folders (``files``)."""
    snapshot_command: str | None = None
    """``command`` kind: writes the state into the folder named by ``$REROLL_STATE_DIR``."""
    restore_command: str | None = None
    """``command`` kind: reads the state back from ``$REROLL_STATE_DIR``."""
    query_command: str | None = None
    """The environment's ``query``: a shell command run as root in the sandbox before the verifier;
    its stdout is written to ``environment_state.txt`` in the verifier's folder (next to test.sh,
    and to the run folder's ``verifier/``), so a test reads the state without reaching the service."""
    service: str | None = None
    """The service whose container holds the state (docker image services); None: the sandbox."""

    @model_validator(mode="after")
    def _complete(self) -> StateSpec:
        if self.kind == "command" and not (self.snapshot_command and self.restore_command):
            raise ValueError("state kind 'command' needs both 'snapshot_command' and 'restore_command'")
        if self.kind != "command" and not self.paths:
            raise ValueError(f"state kind {self.kind!r} needs 'paths'")
        if any(not path.startswith("/") for path in self.paths):
            raise ValueError("state paths must be absolute")
        return self


class McpServerSpec(BaseModel):
    """An MCP server offered to the agent (benchflow's ``[[environment.mcp_servers]]``,
    ``MCPServerConfig``): a ``stdio`` one is started by the agent inside the sandbox with
    `command` and `args`; an ``sse`` or ``streamable-http`` one is reached at `url` (typically a
    service's). Each agent gets it through its native MCP configuration."""

    model_config = ConfigDict(extra="forbid")
    name: str
    transport: Literal["stdio", "sse", "streamable-http"] = "sse"
    """benchflow's default is ``sse``; ``http`` is read as ``streamable-http``."""
    command: str | None = None
    args: list[str] = []
    cwd: str | None = None
    env: dict[str, str] = {}
    url: str | None = None
    headers: dict[str, str] = {}
    tools: list[str] | None = None
    """Only these tools of the server are offered."""
    include_tags: list[str] | None = None
    """Only the tools tagged with at least one of these are offered (FastMCP's tags)."""
    exclude_tags: list[str] | None = None
    """No tool tagged with any of these is offered (FastMCP's tags; wins over `include_tags`).
    Each filter applies on top of the others; how each agent gets them: `reroll.rollout.mcp`."""
    optional: bool = False
    """An agent without MCP support may run the task without it (otherwise it is refused)."""

    @field_validator("transport", mode="before")
    @classmethod
    def _http_alias(cls, value: object) -> object:
        return "streamable-http" if value == "http" else value

    @field_validator("tools", "include_tags", "exclude_tags")
    @classmethod
    def _some_names(cls, value: list[str] | None) -> list[str] | None:
        """benchflow's rule: entries stripped, blank ones dropped, and none left is an error
        (an empty filter would offer nothing; leave the field out to offer everything)."""
        if value is None:
            return None
        names = [name.strip() for name in value if name.strip()]
        if not names:
            raise ValueError("an MCP tool filter (tools, include_tags, exclude_tags) needs at least one name")
        return names

    @property
    def filters(self) -> dict[str, list[str]]:
        """The tool filters the server has (``tools``, ``include_tags``, ``exclude_tags``), by name."""
        named = {"tools": self.tools, "include_tags": self.include_tags, "exclude_tags": self.exclude_tags}
        return {name: value for name, value in named.items() if value is not None}

    @model_validator(mode="after")
    def _reachable(self) -> McpServerSpec:
        if self.transport == "stdio" and not self.command:
            raise ValueError(f"MCP server {self.name!r}: transport 'stdio' needs 'command'")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"MCP server {self.name!r}: transport {self.transport!r} needs 'url'")
        return self


class ForwardEnv(BaseModel):
    """``[environment.forward_env]``: host variables passed into the environment (never a secret:
    the LLM proxy holds the provider keys)."""

    model_config = ConfigDict(extra="forbid")
    keys: list[str] = []


def check_services(services: list[ServiceSpec]) -> list[ServiceSpec]:
    """`services` when their names are unique and every ``depends_on`` names another of them
    without a cycle.

    Raises:
        ValueError: a duplicate name, an unknown dependency, or a cycle (named).
    """
    names = [service.name for service in services]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"services declared twice: {', '.join(duplicates)}")
    by_name = {service.name: service for service in services}
    for service in services:
        unknown = [name for name in service.depends_on if name not in by_name]
        if unknown:
            raise ValueError(f"service {service.name!r} depends on unknown services: {', '.join(unknown)}")
    start_order(services)
    return services


def start_order(services: list[ServiceSpec]) -> list[ServiceSpec]:
    """`services` in an order where each comes after everything it ``depends_on`` (declaration
    order otherwise).

    Raises:
        ValueError: the dependencies form a cycle (its services named).
    """
    by_name = {service.name: service for service in services}
    ordered: list[ServiceSpec] = []
    visiting: list[str] = []

    def visit(service: ServiceSpec) -> None:
        if service in ordered:
            return
        if service.name in visiting:
            cycle = [*visiting[visiting.index(service.name) :], service.name]
            raise ValueError(f"services depend on each other in a cycle: {' -> '.join(cycle)}")
        visiting.append(service.name)
        for name in service.depends_on:
            visit(by_name[name])
        visiting.pop()
        ordered.append(service)

    for service in services:
        visit(service)
    return ordered
