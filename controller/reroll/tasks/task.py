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
The configuration's sections themselves are `reroll.tasks.spec`'s.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ValidationError
from reroll_contracts.errors import TaskError
from reroll_contracts.sandbox_paths import LOGS_MOUNT

from reroll.tasks.compat import normalise, prompt_of, split_ignored
from reroll.tasks.environment import ServiceSpec
from reroll.tasks.manifest import apply_manifest, compose_services, pinned_manifest
from reroll.tasks.rubric import (
    COMMAND_SCRIPT,
    command_files,
    document_aggregate_policy,
    document_strategy,
)
from reroll.tasks.spec import NATIVE_AGENT_USER, SCRIPTLESS_TYPES, TaskSpec, VerifierSection
from reroll.tasks.strategies import checked_strategy

COMPOSE_FILES = ("docker-compose.yaml",)
"""Harbor's compose file names in a task's ``environment/`` folder: Harbor and BenchFlow read
``docker-compose.yaml`` only, so a ``docker-compose.yml`` beside it (a developer's file) is not
the task's."""


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
