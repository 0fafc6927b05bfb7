"""Load tasks from disk, in both layouts BenchFlow reads (see seeds/concepts.txt, "Verifier file map").

Native layout (benchflow)::

    my-task/
      task.md              YAML front matter (name, agent, verifier, environment or sandbox) + the prompt
      environment/         Dockerfile; workspace/ is the initial content of the agent's workspace
      verifier/test.sh     the verifier's entry point, uploaded to /verifier (tests/ → /tests also works)
      verifier/verifier.md optional: the strategy (script, llm-judge, agent-judge), see
                           `reroll.tasks.rubric`; a script's command (e.g. ``python3 grade.py``)
                           runs from /verifier instead of test.sh
      verifier/rubrics/    an llm-judge task's rubric (verifier.toml + verifier.md), instead of test.sh
      oracle/solve.sh      optional reference solution, uploaded to /oracle for the `oracle` agent

Legacy (Harbor / Terminal-Bench) split layout::

    my-task/
      task.toml            [agent] timeout_sec, user; [verifier] timeout_sec, env; [environment] ...
      instruction.md       the prompt
      environment/         as above
      tests/test.sh        uploaded to /tests
      solution/solve.sh    uploaded to /solution

Either configuration is read by `reroll.tasks.compat` first: Harbor's and benchflow's fields are
mapped onto reroll's (``memory = "4G"`` → ``memory_mb = 4096``, ``allow_internet = false`` →
``network = "none"``), and those reroll does not model are kept in `Task.ignored` with the
reason. The conventions that differ between the layouts — the agent's user and working folder,
where the verifier goes — are resolved by `Task` (`Task.agent_user`, `Task.workdir`, `Task.verifier_mount`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from reroll_contracts.errors import TaskError
from reroll_contracts.hardening import HardeningOptions
from reroll_contracts.network import EVERYWHERE, NetworkPolicy, PhaseNetworks
from reroll_contracts.sandbox_paths import LOGS_MOUNT

from reroll.tasks.allowlist import AllowedHostsField, DeniedHostsField
from reroll.tasks.compat import normalise, prompt_of, split_ignored
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
from reroll.tasks.manifest import apply_manifest, compose_services, pinned_manifest
from reroll.tasks.rubric import (
    COMMAND_SCRIPT,
    PolicyField,
    command_files,
    document_aggregate_policy,
    document_strategy,
)
from reroll.tasks.strategies import checked_strategy

JUDGED_TYPES = ("llm-judge", "agent-judge")
"""Verifier types whose judge is a model (the folder may then hold only a rubric)."""
SCRIPTLESS_TYPES = (*JUDGED_TYPES, "reward-kit", "ors-episode")
"""Verifier types that score without a test.sh."""
COMPOSE_FILES = ("docker-compose.yaml",)
"""Harbor's compose file names in a task's ``environment/`` folder: Harbor and BenchFlow read
``docker-compose.yaml`` only, so a ``docker-compose.yml`` beside it (a developer's file) is not
the task's."""
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
        address allowed (`reroll_contracts.network.EVERYWHERE`) but the denied hosts'; the verify
        phase keeps ``full`` (BenchFlow's deny list holds the agent only).

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
        if denied := environment.blocked_hosts:
            if environment.network != "full" or self.agent.network not in (None, "full"):
                raise TaskError("environment.blocked_hosts needs network full (network_mode denylist)")
            phases |= {"agent": "none", "agent_allowed": EVERYWHERE, "agent_denied": tuple(denied)}
        return PhaseNetworks.model_validate(phases)


class FieldNote(BaseModel):
    """A field of a task's configuration, and what became of it."""

    field: str
    """Its dotted path (``environment.gpus``), or a file or body section (``task.toml``, ``## role:x``)."""
    note: str
    """Why it is ignored, or what it was mapped to."""


class Task(BaseModel):
    """A task loaded from disk, with its conventions resolved.

    Attributes hold host paths; `verifier_mount` and `solution_mount` are where the verifier and
    the solution go inside the sandbox (absolute, under the sandbox root).
    """

    name: str
    path: Path
    layout: Literal["native", "legacy"]
    """Which configuration file was loaded: task.md (native) or task.toml (legacy)."""
    instruction: str
    spec: TaskSpec
    verifier_dir: Path
    solution_dir: Path | None
    verifier_mount: str
    """``/verifier`` for a ``verifier/`` folder, ``/tests`` for ``tests/`` (benchflow's rule)."""
    solution_mount: str
    """``/oracle`` for an ``oracle/`` folder, ``/solution`` for ``solution/``."""
    logs_mount: str = LOGS_MOUNT
    """Holds ``agent/`` and ``verifier/`` (the reward file), in every layout."""
    ignored: list[FieldNote] = []
    """Fields (and files) of the task reroll does not honour, with the reason; reported once."""
    mapped: list[FieldNote] = []
    """Foreign fields honoured under reroll's name (``environment.memory`` → ``memory_mb``)."""
    skills_hidden: bool = False
    """The rollout's agents must not see the task's ``environment/skills`` (skill modes
    ``no-skill`` and ``self-gen``, or skills from elsewhere): an image build leaves the folder out
    of its context and drops the Dockerfile's COPY lines of it alone
    (`reroll.tasks.variants.with_skills_hidden`)."""

    @property
    def agent_user(self) -> str | None:
        """The user the agent runs as: the task's ``agent.user``, else ``agent`` for native tasks;
        None for legacy ones: the image's USER (root when unset), as Harbor does."""
        if self.spec.agent.user is not None:
            return self.spec.agent.user
        return NATIVE_AGENT_USER if self.layout == "native" else None

    @property
    def workdir(self) -> str | None:
        """The agent's working folder: the task's ``environment.workdir``; None: the image's
        WORKDIR, else `reroll_contracts.sandbox_paths.DEFAULT_WORKDIR`."""
        return self.spec.environment.workdir

    @property
    def workspace_seed_dir(self) -> Path | None:
        """The folder whose content seeds the workspace (`environment/workspace/`), if the task has one."""
        seed = self.path / "environment" / "workspace"
        return seed if seed.is_dir() else None

    @property
    def compose_file(self) -> Path | None:
        """Harbor's `environment/docker-compose.yaml` (never ``.yml``), if the task has one; its
        services are among ``spec.environment.services`` (`reroll.tasks.manifest.compose_services`)."""
        return compose_file(self.path)

    @property
    def dockerfile(self) -> Path | None:
        """The Dockerfile of the sandbox's image, if it has one: ``environment.build``'s, else
        `environment/Dockerfile`."""
        build = self.spec.environment.build
        if build is not None:
            return self.path / build.context / build.dockerfile
        dockerfile = self.path / "environment" / "Dockerfile"
        return dockerfile if dockerfile.is_file() else None

    @property
    def build_context(self) -> Path:
        """The folder sent to the image build of `dockerfile`: ``environment.build``'s context,
        else ``environment/``."""
        build = self.spec.environment.build
        return self.path / build.context if build is not None else self.path / "environment"

    def service_context(self, service: ServiceSpec) -> Path:
        """The host folder `service`'s image is built from (its ``build.context``, relative to
        the task's folder unless absolute).

        Raises:
            ValueError: `service` has no ``build``.
        """
        if service.build is None:
            raise ValueError(f"service {service.name} is not built")
        return self.path / service.build.context


def compose_file(task_dir: Path) -> Path | None:
    """Harbor's compose file in `task_dir`'s ``environment/`` folder (`COMPOSE_FILES`), if any."""
    found = (task_dir / "environment" / name for name in COMPOSE_FILES)
    return next((path for path in found if path.is_file()), None)


SKILLS_FOLDER = "skills"
"""The folder of ``environment/`` that holds a task's skills (SkillsBench's, BenchFlow's)."""


def load_task(path: Path, manifest: Path | None = None) -> Task:
    """Load the task in folder `path`: task.md (native) first, then task.toml (legacy); with
    `manifest` (an environment manifest file, a run's ``--environment-manifest``), that manifest
    instead of the one the task pins or holds (`reroll.tasks.manifest`).

    A folder holding both loads task.md, and task.toml when task.md does not load (the reason is
    then in `Task.ignored`).

    Raises:
        TaskError: the folder does not exist, holds neither task.md nor task.toml, no
            configuration loads (the message names the file and the cause), or the verifier's
            test.sh is missing.
    """
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise TaskError(f"task {path}: cannot be resolved ({exc})") from exc
    if not path.is_dir():
        raise TaskError(f"task not found: {path} is not a directory")
    native, legacy = (path / "task.md").is_file(), (path / "task.toml").is_file()
    if not native and not legacy:
        raise TaskError(f"{path} is not a task: it holds neither task.md nor task.toml")
    if not native:
        return _load_legacy(path, manifest)
    try:
        task = _load_native(path, manifest)
    except TaskError as exc:
        if not legacy:
            raise
        try:
            task = _load_legacy(path, manifest)
        except TaskError as legacy_exc:
            raise TaskError(f"{exc}\nand task.toml does not load either: {legacy_exc}") from exc
        return _noted(task, "task.md", f"does not load, task.toml was loaded instead: {exc}")
    if legacy:
        return _noted(task, "task.toml", "task.md takes precedence")
    return task


def _noted(task: Task, field: str, note: str) -> Task:
    return task.model_copy(update={"ignored": [FieldNote(field=field, note=note), *task.ignored]})


def find_task(name_or_path: str, tasks_dir: Path | None = None) -> Task:
    """Resolve a task given as a path, or as a name inside `tasks_dir`.

    Raises:
        TaskError: nothing found under either reading; the message lists where it looked.
    """
    candidates = [Path(name_or_path)]
    if tasks_dir is not None:
        candidates.insert(0, tasks_dir / Path(name_or_path).name)
    for candidate in candidates:
        if candidate.is_dir():
            return load_task(candidate)
    looked = ", ".join(str(c) for c in candidates)
    raise TaskError(f"task {name_or_path!r} not found (looked in: {looked})")


def _load_native(path: Path, manifest: Path | None) -> Task:
    source = path / "task.md"
    text = source.read_text(encoding="utf-8").replace("\r\n", "\n")
    front: object = {}
    body = text
    if text.startswith("---"):
        parts = text.split("\n---", 1)
        if len(parts) != 2:
            raise TaskError(f"{source}: front matter opened with '---' is never closed")
        try:
            front = yaml.safe_load(parts[0][3:]) or {}
        except yaml.YAMLError as exc:
            raise TaskError(f"{source}: invalid YAML front matter: {exc}") from exc
        body = parts[1].split("\n", 1)[1] if "\n" in parts[1] else ""
    prompt, sections = prompt_of(body)
    folders: dict[str, str] = {}
    if isinstance(front, dict):  # benchflow's path shorthands: `verifier: checks/`, `oracle: ref/`
        folders = {key: front.pop(key) for key in ("verifier", "oracle") if isinstance(front.get(key), str)}
    spec, ignored, mapped = _spec(front, source, path, manifest)
    mapped += [(key, f"the folder {folder}") for key, folder in folders.items()]
    return _task(path, "native", prompt, spec, ignored + sections, mapped, folders)


def _load_legacy(path: Path, manifest: Path | None) -> Task:
    source = path / "task.toml"
    try:
        raw = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{source}: invalid TOML: {exc}") from exc
    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise TaskError(f"{path}: legacy task without instruction.md")
    spec, ignored, mapped = _spec(raw, source, path, manifest)
    return _task(path, "legacy", instruction_file.read_text(encoding="utf-8"), spec, ignored, mapped)


def _spec(
    raw: object, source: Path, task_dir: Path, manifest: Path | None = None
) -> tuple[TaskSpec, list[tuple[str, str]], list[tuple[str, str]]]:
    """`raw` with the task's environment manifest (`manifest`, else its own) and compose services
    merged in (`reroll.tasks.manifest`), normalised (`reroll.tasks.compat`) and validated: the
    spec, the ignored and the mapped fields."""
    if not isinstance(raw, dict):
        raise TaskError(
            f"{source}: invalid task configuration: a mapping is expected, not {type(raw).__name__}"
        )
    environment_mapped: list[tuple[str, str]] = []
    environment_ignored: list[tuple[str, str]] = []
    try:
        own = pinned_manifest(raw, task_dir)  # taken out of `raw` either way
        if (manifest := manifest or own) is not None:
            has_dockerfile = (task_dir / "environment" / "Dockerfile").is_file()
            environment_mapped, environment_ignored = apply_manifest(raw, manifest, has_dockerfile)
        data, mapped = normalise(raw)
    except TaskError as exc:
        raise TaskError(f"{source}: invalid task configuration: {exc}") from exc
    if (compose := compose_file(task_dir)) is not None:
        services, build, main_env, compose_mapped, compose_ignored = compose_services(compose)
        environment = data.setdefault("environment", {})
        if isinstance(environment, dict) and main_env:
            environment["env"] = {**main_env, **(environment.get("env") or {})}
        if isinstance(environment, dict) and services:
            environment["services"] = [*(environment.get("services") or []), *services]
        if isinstance(environment, dict) and build is not None:
            environment.setdefault("build", build)
        environment_mapped += compose_mapped
        environment_ignored += compose_ignored
    ignored = environment_ignored + split_ignored(data, TaskSpec)
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise TaskError(f"{source}: invalid task configuration:\n{exc}") from exc
    environment = spec.environment
    builds = [("environment.build", environment.build)]
    builds += [(f"service {service.name}: build", service.build) for service in environment.services]
    for field, declared in builds:
        if declared is not None and not (task_dir / declared.context / declared.dockerfile).is_file():
            raise TaskError(
                f"{source}: {field}: no Dockerfile {declared.dockerfile} in the context "
                f"{task_dir / declared.context}"
            )
    return spec, ignored, environment_mapped + mapped


def _check_command(path: Path, verifier_dir: Path, section: VerifierSection) -> None:
    """Refuse a ``verifier.command`` that cannot run as BenchFlow runs it (`command_files`),
    with a verifier other than ``test-script``, or beside a file named `COMMAND_SCRIPT`.

    Raises:
        TaskError: naming the task folder and the cause.
    """
    if section.type != "test-script":
        raise TaskError(f"{path}: verifier.command is the test-script verifier's, not {section.type}'s")
    if (verifier_dir / COMMAND_SCRIPT).exists():
        raise TaskError(f"{path}: {verifier_dir / COMMAND_SCRIPT}: this name is reroll's, for the command")
    try:
        command_files(str(section.command), verifier_dir)
    except TaskError as exc:
        raise TaskError(f"{path}: {exc}") from exc


def _task(
    path: Path,
    layout: Literal["native", "legacy"],
    instruction: str,
    spec: TaskSpec,
    ignored: list[tuple[str, str]],
    mapped: list[tuple[str, str]],
    folders: dict[str, str] | None = None,
) -> Task:
    """The task, its verifier and solution folders found as benchflow finds them: ``verifier/``
    (→ /verifier) else ``tests/`` (→ /tests); ``oracle/`` (→ /oracle) else ``solution/`` (→
    /solution); `folders` (``{"verifier": PATH, "oracle": PATH}``, task.md's path shorthands)
    name others, which go to /verifier and /oracle."""
    folders = folders or {}
    for key, folder in folders.items():
        if Path(folder).is_absolute() or ".." in Path(folder).parts:
            raise TaskError(f"{path}: {key}: {folder!r} must be a relative path inside the task")
    verifier = folders.get("verifier") or ("verifier" if (path / "verifier").is_dir() else "tests")
    solution = folders.get("oracle") or ("oracle" if (path / "oracle").is_dir() else "solution")
    if (declared := document_strategy(path / verifier)) is not None:
        kind, options = declared
        command = options.pop("command", spec.verifier.command)
        update = {"type": kind, "options": spec.verifier.options | options, "command": command}
        spec = spec.model_copy(update={"verifier": spec.verifier.model_copy(update=update)})
        mapped = [*mapped, (f"{verifier}/verifier.md", f"verifier.type = {kind}")]
    if policy := document_aggregate_policy(path / verifier):
        section = spec.verifier.model_copy(update={"aggregate_policy": policy})
        spec = spec.model_copy(update={"verifier": section})
    if (criteria := checked_strategy(spec.verifier.type, spec.verifier.options, path / verifier)) is not None:
        section = spec.verifier.model_copy(update={"aggregate_policy": criteria})
        spec = spec.model_copy(update={"verifier": section})
    judged = spec.verifier.type in SCRIPTLESS_TYPES
    if spec.verifier.command is not None:
        _check_command(path, path / verifier, spec.verifier)
    elif not judged and not (path / verifier / "test.sh").is_file():
        looked = f"{verifier}/test.sh" if "verifier" in folders else "verifier/test.sh or tests/test.sh"
        raise TaskError(f"{path}: the verifier entry point is missing (looked for {looked})")
    verifier_mount = "/verifier" if "verifier" in folders else f"/{verifier}"
    solution_mount = "/oracle" if "oracle" in folders else f"/{solution}"
    if spec.agent.prompt_prefix:
        instruction = f"{spec.agent.prompt_prefix.strip()}\n\n{instruction.strip()}"
    if not instruction.strip():
        raise TaskError(f"{path}: the task's prompt is empty")
    return Task(
        name=spec.name or path.name,
        path=path,
        layout=layout,
        instruction=instruction.strip() + "\n",
        spec=spec,
        verifier_dir=path / verifier,
        solution_dir=path / solution if (path / solution).is_dir() else None,
        verifier_mount=verifier_mount,
        solution_mount=solution_mount,
        ignored=[FieldNote(field=field, note=note) for field, note in ignored],
        mapped=[FieldNote(field=field, note=note) for field, note in mapped],
    )
