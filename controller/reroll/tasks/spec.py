"""A task's configuration, section by section: task.md's front matter or task.toml, the same
fields in both layouts once `reroll.tasks.compat.normalise` has mapped Harbor's and benchflow's
spellings (`TaskSpec` and its ``[agent]``, ``[verifier]``, ``[environment]`` and ``[solution]``
sections), with each phase's network policy (`TaskSpec.networks`). `reroll.tasks.task` loads a
task folder into a `reroll.tasks.task.Task` around it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from reroll_contracts.errors import TaskError
from reroll_contracts.hardening import HardeningOptions
from reroll_contracts.network import EVERYWHERE, NetworkPolicy, PhaseNetworks

from reroll.tasks.allowlist import AllowedHostsField, BlockedUrlsField, DeniedHostsField
from reroll.tasks.environment import (
    ForwardEnv,
    HealthCheck,
    ImageBuild,
    McpServerSpec,
    Readiness,
    ServiceSpec,
    SetupCommand,
    StateSpec,
    TaskSelection,
    check_services,
)
from reroll.tasks.rubric import PolicyField

JUDGED_TYPES = ("llm-judge", "agent-judge")
"""Verifier types whose judge is a model (the folder may then hold only a rubric)."""
SCRIPTLESS_TYPES = (*JUDGED_TYPES, "reward-kit", "ors-episode")
"""Verifier types that score without a test.sh."""
NATIVE_AGENT_USER = "agent"
"""The agent's user in native tasks that name none (benchflow's default ``sandbox_user``)."""


class AgentSection(BaseModel):
    """The `agent` section of a task."""

    model_config = ConfigDict(extra="forbid")
    timeout_sec: float = Field(default=600.0, gt=0)
    """Wall-clock budget of the agent phase, in seconds."""
    user: str | None = None
    """The user the agent runs as (a name, or a uid as text; ``root``). None: the layout's
    default — ``agent`` (unprivileged, created when missing) for native tasks, the image's
    ``USER`` (root when unset) for legacy ones, as benchflow and Harbor do."""
    prompt_prefix: str | None = None
    """Text put before the prompt (benchflow's ``agent.prompt_prefix``)."""
    network: NetworkPolicy | None = None
    """The agent phase's egress (the oracle's too; benchflow's and Harbor's ``agent.network_mode``).
    None: ``environment.network``."""
    allowed_hosts: AllowedHostsField = []
    """Under network ``none``, what the agent phase reaches beyond the LLM proxy (Harbor's and
    benchflow's ``allowed_hosts`` with ``network_mode = "allowlist"``; forms:
    `reroll.tasks.allowlist`). None of its own and no ``network``: ``environment.allowed_hosts``."""


class VerifierSection(BaseModel):
    """The `verifier` section of a task."""

    model_config = ConfigDict(extra="forbid")
    network: NetworkPolicy | None = None
    """The verify phase's egress (benchflow's and Harbor's ``verifier.network_mode``), enforced for
    the test script: stricter than the agent's, it runs in a network namespace with only
    loopback; looser, the sandbox gets egress while it runs. None: ``environment.network``."""
    allowed_hosts: AllowedHostsField = []
    """Under network ``none``, what the verify phase reaches beyond the LLM proxy (Harbor's and
    benchflow's ``allowed_hosts``; forms: `reroll.tasks.allowlist`). None of its own and no
    ``network``: ``environment.allowed_hosts``."""
    type: str = "test-script"
    """Which verifier scores the task (benchflow's ``verifier.type``): a name of
    `reroll.rollout.verify.verifiers.VERIFIERS` (``test-script``: the task's ``test.sh``, the fields
    below), or the dotted path of a verifier class (``package.module:Class``); checked before a
    rollout starts."""
    options: dict[str, Any] = {}
    """What that verifier is made with (a judge's model, rubric ...); ``test-script`` takes none."""
    command: str | None = None
    """``test-script`` only: the shell command that scores the run instead of ``test.sh``
    (BenchFlow's ``script`` strategy ``command`` in ``verifier/verifier.md``, e.g. ``python3
    grade.py``), run with ``bash -c`` (``sh -c`` where bash is missing) from the uploaded verifier
    folder, with everything else as for test.sh. It must name a file of that folder
    (`reroll.tasks.rubric.command_files`). None: the folder's ``test.sh``."""
    timeout_sec: float = Field(default=300.0, gt=0)
    """Wall-clock budget of the verifier's test script, in seconds."""
    hardening: HardeningOptions = Field(default_factory=HardeningOptions)
    """Which hardening steps run before the test script."""
    env: dict[str, str] = {}
    """Extra environment of the test script (after hardening's own variables are set)."""
    aggregate_policy: PolicyField = {}
    """How a graded ``reward.json``'s items make one reward (``method``, ``weights``, ``threshold``,
    ``criteria``; `reroll_contracts.graded`), overriding the file's own ``aggregate`` key by key:
    BenchFlow's ``verifier.outputs.aggregate_policy`` in ``verifier/verifier.md``. Empty: none."""
    pytest_plugins: list[str] = []
    """pytest plugins (``pytest11`` entry-point or module names, e.g. ``ctrf``) the verifier's pytest
    loads with ``-p NAME`` while autoloading is off, beside the image's root-owned ones present
    before the agent ran (BenchFlow's ``[verifier] pytest_plugins``)."""


class EnvironmentSection(BaseModel):
    """The `environment` section of a task (benchflow's `sandbox`): what the sandbox needs."""

    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(default=1.0, gt=0)
    """CPU limit (cores) for container backends and the isolated `local` sandbox (its cgroup)."""
    memory_mb: int = Field(default=2048, gt=0)
    """Memory limit in MiB for container backends and the isolated `local` sandbox (swap included:
    none beyond it; in `local`, what it writes outside its bound folders counts too)."""
    pids_max: int = Field(default=1024, gt=0)
    """How many processes and threads the sandbox may hold at once (container backends, the
    isolated `local`): a fork bomb gets EAGAIN instead of exhausting the host's process table."""
    storage_mb: int = Field(default=10240, gt=0)
    """Disk quota in MiB of what the agent writes (container backends: the workspace and ``/tmp``
    share it; the isolated `local`: its RAM-backed writable layer and ``/tmp``, at most 3/4 of
    ``memory_mb``); Harbor's field and default."""
    network: NetworkPolicy = "full"
    """Egress policy of every phase that sets none of its own (``agent.network``,
    ``verifier.network``): `none` lets the sandbox reach only the LLM proxy. Harbor's
    ``allow_internet`` and ``network_mode`` (benchflow's ``sandbox.network_mode``) map onto it."""
    allowed_hosts: AllowedHostsField = []
    """Under network ``none``, what every phase that sets no ``network`` reaches beyond the LLM
    proxy (Harbor's and benchflow's ``allowed_hosts`` with ``network_mode = "allowlist"``; forms:
    `reroll.tasks.allowlist`)."""
    blocked_hosts: DeniedHostsField = []
    """Under network ``full``, hostnames (each with its subdomains) the agent phase may not reach
    (benchflow's ``blocked_hosts`` with ``network_mode = "denylist"``): that phase then runs as
    ``none`` with every address allowed but theirs (`reroll_contracts.network.PhaseNetworks`)."""
    blocked_urls: BlockedUrlsField = []
    """Under network ``full``, URL prefixes the agent phase may not reach (benchflow's
    ``blocked_urls`` with ``network_mode = "denylist"``; matched as BenchFlow does: host without
    ``www.``, decoded path prefix, any scheme and port): that phase then runs as ``none``, its
    HTTP(S) through an interceptor that answers 403 under them (`reroll.host.intercept.DenyList`)."""
    workdir: str | None = None
    """The agent's working folder (absolute, not ``/``). None: the image's WORKDIR, else ``/app``."""
    env: dict[str, str] = {}
    """Extra environment of every process in the sandbox (agent, oracle, verifier)."""
    docker_image: str | None = None
    """A prebuilt image to run when the task has no ``environment/Dockerfile`` (container backends)."""
    build: ImageBuild | None = None
    """Where the sandbox's image is built from when not ``environment/Dockerfile`` in the context
    ``environment/`` (docker): Harbor's compose ``main`` service's ``build``, or set inline."""
    build_timeout_sec: float = Field(default=600.0, gt=0)
    """How long building the task's ``environment/Dockerfile`` (and each image a service ``build``s)
    may take, in seconds (docker; Harbor's field and default); the catalogue images it starts from
    are built before, not counted."""
    skills_dir: str | None = None
    """Where the task's image puts its skills (SkillsBench's, informational): reroll mounts the
    task's ``environment/skills`` at each agent's native skill paths instead (``--skills``)."""
    services: list[ServiceSpec] = []
    """Services the framework starts before the agent (``[[environment.services]]``), in
    ``depends_on`` order; the agent starts when all are healthy."""
    owns_lifecycle: bool = False
    """The image's own entrypoint starts the services (chi-bench): reroll starts none and only
    gates on `readiness` and `healthcheck`. Exclusive with `services`."""
    readiness: Readiness = Field(default_factory=Readiness)
    """Extra probes the agent waits for, and the time limit of the whole readiness gate."""
    healthcheck: HealthCheck | None = None
    """A probe of the whole environment (benchflow's ``healthcheck``), part of the readiness gate."""
    task_selection: TaskSelection | None = None
    """How an image serving many tasks is told which one this is; None: it is not told."""
    forward_env: ForwardEnv = Field(default_factory=ForwardEnv)
    """Host variables passed into the environment."""
    state: StateSpec | None = None
    """The environment's state that a checkpoint captures; None: stateless."""
    mcp_servers: list[McpServerSpec] = []
    """MCP servers offered to the agent through its native MCP configuration."""
    setup_commands: list[SetupCommand] = []
    """Shell lines run in the sandbox, in order, once the services are ready and before the agent
    (BenchFlow's ``sandbox.setup_commands``; `reroll.environment.setup`)."""
    ports: list[int] = []
    """Ports the environment serves beyond its services' own (BenchFlow's manifest ``ports``): with
    theirs, its endpoints ``http://localhost:PORT`` in the sandbox (`reroll.environment.services
    .Environment.endpoints`, in ``services/services.json``); none is published to the host."""
    keep_alive: bool = True
    """BenchFlow's manifest ``keep_alive``, "keep the environment up for the whole rollout": True,
    a service that exits after its readiness gate while the agent runs ends the rollout as
    ``environment_error``; False, its exit is recorded and the rollout goes on to verification."""
    isolation: Literal["per_task", "persistent"] = "per_task"
    """BenchFlow's manifest ``isolation``: ``per_task``, a fresh environment each rollout;
    ``persistent`` (cross-episode state) runs as ``per_task`` too, and says so: a rollout's start is
    never another rollout's end, which replay, branching and parallel rollouts rely on."""

    @field_validator("services")
    @classmethod
    def _services_consistent(cls, value: list[ServiceSpec]) -> list[ServiceSpec]:
        return check_services(value)

    @model_validator(mode="after")
    def _lifecycle_consistent(self) -> EnvironmentSection:
        if self.owns_lifecycle and self.services:
            raise ValueError(
                "owns_lifecycle = true means the image starts its services: "
                "remove [[environment.services]] or set owns_lifecycle = false"
            )
        return self

    def endpoints(self) -> list[str]:
        """The environment's endpoints as BenchFlow's ``EnvHandle.endpoints`` lists them (its
        ``ports`` and its services' ``port``), as URLs seen from the sandbox: ``http://localhost:PORT``
        for `ports` and command services, ``http://NAME:PORT`` for an image service (a sibling
        container, reached by its name). Sorted, without repeats."""
        urls = {f"http://localhost:{port}" for port in self.ports}
        for service in self.services:
            if service.port is not None:
                host = service.name if service.sibling else "localhost"
                urls.add(f"http://{host}:{service.port}")
        return sorted(urls, key=lambda url: (url.rsplit(":", 1)[0], int(url.rsplit(":", 1)[1])))

    @field_validator("ports")
    @classmethod
    def _valid_ports(cls, value: list[int]) -> list[int]:
        wrong = [port for port in value if not 1 <= port <= 65535]
        if wrong:
            raise ValueError(f"ports must be TCP ports (1-65535), not {wrong}")
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or value.rstrip("/") == ""):
            raise ValueError("workdir must be an absolute path other than /")
        return value.rstrip("/") if value else value


class SolutionSection(BaseModel):
    """The `solution` section of a task (benchflow's `oracle`)."""

    model_config = ConfigDict(extra="forbid")
    env: dict[str, str] = {}
    """Extra environment of the reference solution (the `oracle` agent)."""


class TaskSpec(BaseModel):
    """The configuration of a task: task.md front matter or task.toml, same fields in both
    (after `reroll.tasks.compat.normalise`)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    schema_version: str | None = None
    """Informational."""
    metadata: dict[str, Any] = {}
    """Informational (author, difficulty, category, tags ...), kept as it is."""
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)

    @model_validator(mode="after")
    def _networks_consistent(self) -> TaskSpec:
        try:
            self.networks()
        except TaskError as exc:
            raise ValueError(str(exc)) from exc
        return self

    def networks(self) -> PhaseNetworks:
        """The network policy of each phase: a phase's own ``network`` and ``allowed_hosts``, else
        ``environment``'s.

        A deny list (``environment.blocked_hosts``) makes the agent phase ``none`` with every
        address allowed (`reroll_contracts.network.EVERYWHERE`) but the denied hosts'; with URL
        prefixes (``environment.blocked_urls``) it is ``none`` with nothing allowed, its HTTP(S)
        through the deny list's interceptor. The verify phase keeps ``full`` (BenchFlow's deny
        list holds the agent only).

        Raises:
            TaskError: an allow-list on a phase whose policy is ``full``; a deny list under ``none``.
        """
        environment = self.environment
        phases: dict[str, object] = {}
        for name, section in (("agent", self.agent), ("verifier", self.verifier)):
            network = section.network or environment.network
            hosts = section.allowed_hosts or ([] if section.network else environment.allowed_hosts)
            if hosts and network == "full":
                raise TaskError(f"{name}.allowed_hosts needs network none (network_mode allowlist), not full")
            phases[name], phases[f"{name}_allowed"] = network, tuple(hosts)
        denied, urls = tuple(environment.blocked_hosts), tuple(environment.blocked_urls)
        if denied or urls:
            if environment.network != "full" or self.agent.network not in (None, "full"):
                field = "blocked_urls" if urls else "blocked_hosts"
                raise TaskError(f"environment.{field} needs network full (network_mode denylist)")
            allowed = () if urls else EVERYWHERE  # URL prefixes: only the interceptor is reached
            phases |= {"agent": "none", "agent_allowed": allowed, "agent_denied": denied}
            phases["agent_blocked_urls"] = urls
        return PhaseNetworks.model_validate(phases)
