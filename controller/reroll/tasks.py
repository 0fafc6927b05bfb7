"""Load tasks from disk, in both layouts BenchFlow reads (see seeds/concepts.txt, "Verifier file map").

Native layout::

    my-task/
      task.md              YAML front matter (name, agent, verifier, environment) + the prompt body
      environment/         Dockerfile; workspace/ is the initial content of the agent's workspace
      verifier/test.sh     the verifier's entry point, uploaded to /verifier
      oracle/solve.sh      optional reference solution, uploaded to /oracle for the `oracle` agent

Legacy (Harbor / Terminal-Bench) split layout::

    my-task/
      task.toml            [agent] timeout_sec, [verifier] timeout_sec, [environment] cpus, memory_mb ...
      instruction.md       the prompt
      environment/         as above
      tests/test.sh        uploaded to /tests
      solution/solve.sh    uploaded to /solution
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reroll.errors import TaskError


class AgentSection(BaseModel):
    """The `agent` section of a task."""

    model_config = ConfigDict(extra="allow")
    timeout_sec: float = Field(default=600.0, gt=0)
    """Wall-clock budget of the agent phase, in seconds."""


class HardeningOptions(BaseModel):
    """``verifier.hardening``: the anti-reward-hacking steps before the test script (all on by default).

    A task that legitimately needs one off opts out, e.g. ``delete_injected_hooks: false`` when
    the agent is asked to write a conftest.py.
    """

    model_config = ConfigDict(extra="forbid")
    restore_build_config: bool = True
    """Put the workspace's pyproject.toml, setup.py, setup.cfg, pytest.ini, tox.ini back as they were."""
    delete_injected_hooks: bool = True
    """Delete conftest.py, sitecustomize.py, usercustomize.py and .pth files the agent added."""
    pytest_addopts: bool = True
    """Set ``PYTEST_ADDOPTS="-c /dev/null --confcutdir=<verifier dir> -p no:cacheprovider"``."""
    plugin_autoload: bool = False
    """Let pytest load every installed plugin (``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` unset)."""
    pytest_plugins: list[str] = []
    """Plugins loaded explicitly (``-p NAME`` each) while autoloading is off."""
    pytest_report: bool = True
    """With `pytest_addopts`: trust pytest's own JUnit report (written to a root-only folder) over
    the script's exit status — a pytest that started but wrote no report (``os._exit(0)`` at
    import), or whose report counts failures or errors, zeroes every reward. Off for a task whose
    test.sh passes its own ``--junitxml`` or ``--log-file``, or expects failing tests."""


class VerifierSection(BaseModel):
    """The `verifier` section of a task."""

    model_config = ConfigDict(extra="allow")
    timeout_sec: float = Field(default=300.0, gt=0)
    """Wall-clock budget of the verifier's test script, in seconds."""
    hardening: HardeningOptions = Field(default_factory=HardeningOptions)
    """Which hardening steps run before the test script."""


NetworkPolicy = Literal["none", "full"]
"""A sandbox's egress: ``none`` (only the LLM proxy is reachable) or ``full``."""


class EnvironmentSection(BaseModel):
    """The `environment` section of a task: what the sandbox needs."""

    model_config = ConfigDict(extra="allow")
    cpus: float = Field(default=1.0, gt=0)
    """CPU limit (cores) for container backends."""
    memory_mb: int = Field(default=2048, gt=0)
    """Memory limit in MiB for container backends (swap included: none beyond it)."""
    pids_max: int = Field(default=1024, gt=0)
    """How many processes and threads the sandbox may hold at once (container backends): a fork
    bomb gets EAGAIN instead of exhausting the host's process table."""
    storage_mb: int = Field(default=10240, gt=0)
    """Disk quota in MiB of what the agent writes (container backends: the workspace and ``/tmp``
    share it); Harbor's field and default."""
    network: NetworkPolicy = "full"
    """Egress policy: `none` lets the sandbox reach only the LLM proxy (container backends)."""


class TaskSpec(BaseModel):
    """The configuration of a task: task.md front matter or task.toml, same fields in both."""

    model_config = ConfigDict(extra="allow")
    name: str | None = None
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)


class Task(BaseModel):
    """A task loaded from disk.

    Attributes hold host paths; `verifier_mount` and `solution_mount` are where the verifier and
    the solution go inside the sandbox (relative to the sandbox root).
    """

    name: str
    path: Path
    layout: Literal["native", "legacy"]
    instruction: str
    spec: TaskSpec
    verifier_dir: Path
    solution_dir: Path | None
    verifier_mount: str
    solution_mount: str

    @property
    def workspace_seed_dir(self) -> Path | None:
        """The folder whose content seeds the workspace (`environment/workspace/`), if the task has one."""
        seed = self.path / "environment" / "workspace"
        return seed if seed.is_dir() else None

    @property
    def dockerfile(self) -> Path | None:
        """The task's `environment/Dockerfile`, if it has one."""
        dockerfile = self.path / "environment" / "Dockerfile"
        return dockerfile if dockerfile.is_file() else None


def with_network(task: Task, policy: NetworkPolicy | None) -> Task:
    """`task` with its ``environment.network`` replaced by `policy` (a run's override); None: `task`."""
    if policy is None:
        return task
    environment = task.spec.environment.model_copy(update={"network": policy})
    return task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})


def load_task(path: Path) -> Task:
    """Load the task in folder `path`, native layout first, then the legacy one.

    Raises:
        TaskError: the folder does not exist, holds neither task.md nor task.toml, a file is
            invalid (the message names it), or the verifier's test.sh is missing.
    """
    try:
        path = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise TaskError(f"task {path}: cannot be resolved ({exc})") from exc
    if not path.is_dir():
        raise TaskError(f"task not found: {path} is not a directory")
    if (path / "task.md").is_file():
        return _load_native(path)
    if (path / "task.toml").is_file():
        return _load_legacy(path)
    raise TaskError(f"{path} is not a task: it holds neither task.md nor task.toml")


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


def _load_native(path: Path) -> Task:
    source = path / "task.md"
    text = source.read_text(encoding="utf-8")
    front: dict[str, Any] = {}
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
    spec = _validate(front, source)
    return _task(path, "native", body, spec, path / "verifier", path / "oracle", "verifier", "oracle")


def _load_legacy(path: Path) -> Task:
    source = path / "task.toml"
    try:
        raw = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{source}: invalid TOML: {exc}") from exc
    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise TaskError(f"{path}: legacy task without instruction.md")
    spec = _validate(raw, source)
    instruction = instruction_file.read_text(encoding="utf-8")
    return _task(path, "legacy", instruction, spec, path / "tests", path / "solution", "tests", "solution")


def _validate(raw: dict[str, Any], source: Path) -> TaskSpec:
    try:
        return TaskSpec.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(f"{source}: invalid task configuration:\n{exc}") from exc


def _task(
    path: Path,
    layout: Literal["native", "legacy"],
    instruction: str,
    spec: TaskSpec,
    verifier_dir: Path,
    solution_dir: Path,
    verifier_mount: str,
    solution_mount: str,
) -> Task:
    if not (verifier_dir / "test.sh").is_file():
        raise TaskError(f"{path}: the verifier entry point {verifier_dir / 'test.sh'} is missing")
    if not instruction.strip():
        raise TaskError(f"{path}: the task's prompt is empty")
    return Task(
        name=spec.name or path.name,
        path=path,
        layout=layout,
        instruction=instruction.strip() + "\n",
        spec=spec,
        verifier_dir=verifier_dir,
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        verifier_mount=verifier_mount,
        solution_mount=solution_mount,
    )
