"""The job file: which rollouts a job runs (tasks x agents x models x repeats) and how.

A YAML file (every field but ``tasks`` and ``agents`` optional)::

    name: nightly            # job folder name [default: the start time]
    tasks: [examples/tasks/hello-file, examples/tasks/word-count]   # relative to this file
    agents: [oracle, mini-swe-agent]
    models: [scripted]       # agents that call no model (oracle) run once per task and repeat
    repeats: 2
    timeout_seconds: 120     # agent budget [default: each task's]
    concurrency: 4           # rollouts at once
    max_starting: 4          # rollouts starting (model server, proxy, sandbox) at once
    max_retries: 2           # extra attempts for an infrastructure failure
    retry_backoff_seconds: 1 # wait before retry k: backoff x 2^(k-1)
    sandbox: local
    sandbox_config: {}       # the backend's settings, e.g. docker's:
                             # {image_map: {ubuntu:24.04: reroll/base:bookworm}}
    network: null            # none or full: every rollout's egress [default: each task's]
    environment_manifest: null  # an environment manifest bound instead of each task's own: a file
                             # (relative to this file) or NAME[@VERSION] in $BENCHFLOW_ENV_REGISTRY
    environment_services: null  # only these of the environment's services start (--state's tools)
    faults: null             # a fault plan (YAML, relative to this file) the LLM proxy injects
    fault_seed: null         # the seed of its draws [default: the plan's]
    skills: no-skill         # no-skill, with-skill or self-gen (reroll.rollout.skills)
    skills_dir: null         # with-skill: a folder of <name>/SKILL.md (relative to this file)
                             # [default: each task's environment/skills]
    judge_model: null        # an LLM judge's model (judged tasks) [default: each task's]
    user_model: null         # a persona User's model (a trial's persona) [default: the persona's]
    ask_user: false          # offer every agent reroll's ask_user tool over MCP (reroll run --ask-user)
    without_mcp: false       # run every agent without the tasks' MCP servers (reroll run --without-mcp)
    checkpoint_every: 0      # capture a checkpoint every N steps (reroll run --checkpoint-every)
    checkpoint_keep: 64      # a pool checkpoint at every step on local with btrfs, at most N kept (0: off)
    max_steps: null          # cut each rollout after N steps (reroll run --max-steps) [default: none]
    trial: null              # a trial file (relative to this file): every rollout runs its scenes,
                             # the job's agent playing the roles that name none (reroll run --trial)
    executor: asyncio        # or ray (pip install 'reroll[ray]'), see reroll.jobs.executors
    schedule: parallel-independent   # or sequential-shared: one rollout after another over a
                             # learner store (reroll.jobs.learning; asyncio executor only)
    store: null              # sequential-shared only: a folder (skills/, memory/) holding the store's
                             # generation 0 (relative to this file) [default: an empty store]
    ray_address: null        # ray only: a cluster to join (auto, ray://...); null: a local instance

CLI flags of ``reroll job`` override the file's values field by field (``sandbox_config`` key by
key: ``--image-map`` sets its ``image_map``). The resolved spec is
saved as ``job.json`` in the job folder, so ``reroll job --resume JOB_DIR`` needs nothing else.
Every rollout runs with the settings `JobSpec.settings` gives (`reroll.settings.RolloutSettings`;
`SETTINGS_KEYS` names the key of each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reroll_contracts.errors import JobError
from reroll_contracts.network import NetworkPolicy

from reroll.host.llm_proxy import faults_used
from reroll.models.spec import resolved_spec
from reroll.runfolder.paths import JobPaths
from reroll.sandbox.base import load_backend
from reroll.settings import DEFAULT_CHECKPOINT_KEEP, RolloutSettings
from reroll.tasks.manifest import resolve_manifest
from reroll.trials.config import DEFAULT_SKILL_MODE, SkillMode, TrialConfig, load_trial
from reroll.yamlfiles import read_mapping

Schedule = Literal["parallel-independent", "sequential-shared"]
"""How a job's rollouts are scheduled: each on its own (at ``concurrency``), or one after another
over a shared, versioned learner store (`reroll.jobs.learning`)."""

SETTINGS_KEYS: dict[str, str] = {
    "timeout_seconds": "timeout_seconds",
    "sandbox": "sandbox",
    "sandbox_config": "sandbox_config",
    "network": "network",
    "environment_manifest": "environment_manifest",
    "environment_services": "environment_services",
    "faults": "faults",
    "checkpoint_every": "checkpoint_every",
    "checkpoint_keep": "checkpoint_keep",
    "max_steps": "max_steps",
    "skill_mode": "skills",
    "skills_dir": "skills_dir",
    "judge_model": "judge_model",
    "ask_user": "ask_user",
    "without_mcp": "without_mcp",
    "user_model": "user_model",
}
"""Each field of `reroll.settings.RolloutSettings` a job file sets → its key in the file. Not here:
``divergence_policy`` (a job records, it replays nothing), ``trust`` (a job records: it runs only
the code its file names) and ``learner_store`` (each rollout's generation, from ``schedule`` and
``store``)."""

DEFAULT_MAX_STARTING = 4
"""Default bound on rollouts in their start-up phase at once (see `JobSpec.max_starting`)."""


class RunnerOptions(BaseModel):
    """How a batch of rollouts runs together — a job's, ``continue-job``'s, ``branch``'s
    (`reroll.jobs.runner.Runner`); a `JobSpec` holds these fields too."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    concurrency: int = Field(default=4, ge=1)
    """Most rollouts running at once."""
    max_starting: int = Field(default=DEFAULT_MAX_STARTING, ge=1)
    """Most rollouts in their start-up phase (model server, LLM proxy, sandbox start) at once,
    so that many rollouts starting together on few cores stay within the 30 s start-up
    timeouts (asyncio executor; under Ray the cluster's CPUs bound it)."""
    executor: str = "asyncio"
    """Where rollouts run: ``asyncio`` (this process) or ``ray`` (one Ray task per attempt)."""
    ray_address: str | None = None
    """``ray`` executor: the cluster to join (``auto``, ``ray://host:10001``); None starts a
    local Ray instance for the job."""
    max_retries: int = Field(default=2, ge=0)
    """Extra attempts for a rollout that failed for an infrastructure reason (never for an
    agent timeout or an agent error)."""
    retry_backoff_seconds: float = Field(default=1.0, ge=0)
    """Wait before the k-th retry: ``retry_backoff_seconds * 2 ** (k - 1)`` seconds."""


class JobSpec(RunnerOptions):
    """What a job runs, and how (the `RunnerOptions` fields); see the module docstring for the
    file format."""

    name: str | None = Field(default=None, min_length=1, pattern=r"^[^/\\]+$")
    """Job folder name under the jobs dir; None: the start time."""
    tasks: list[Path] = Field(min_length=1)
    """Task folders (a relative path in a job file is relative to the file's folder)."""
    agents: list[str] = Field(min_length=1)
    """Agent names from the registry (``reroll agents``)."""
    models: list[str] = Field(default_factory=list)
    """Model specs for agents that call a model; may be empty if none does."""
    repeats: int = Field(default=1, ge=1)
    """Rollouts per (task, agent, model)."""
    timeout_seconds: float | None = Field(default=None, gt=0)
    """Agent wall-clock budget in seconds; None: each task's own."""
    sandbox: str = "local"
    """Sandbox backend."""
    network: NetworkPolicy | None = None
    """Every rollout's network policy (``none`` needs a container backend); None: each task's."""
    environment_manifest: str | None = None
    """An environment manifest every rollout binds instead of its task's own (``reroll job
    --environment-manifest``): a file (a relative path in a job file is relative to the file's
    folder) or ``NAME[@VERSION]`` in ``$BENCHFLOW_ENV_REGISTRY``; None: each task's."""
    environment_services: list[str] | None = None
    """Only these of the environment's services start (``--state``'s ``tools``); None: all."""
    sandbox_config: dict[str, Any] = Field(default_factory=dict)
    """Settings of the sandbox backend, checked by its config model (`reroll.sandbox.base.Backend`),
    e.g. docker's ``image_map`` (FROM images of tasks' Dockerfiles replaced by local images);
    ``--sandbox-config`` and ``--image-map`` update it key by key. Recorded in each run's config.json."""
    faults: Path | None = None
    """A fault plan (YAML) the LLM proxy of every rollout injects (a relative path in a job file
    is relative to the file's folder); None: no faults."""
    fault_seed: int | None = None
    """The seed of the fault plan's probability draws [default: the plan's ``seed``]."""
    schedule: Schedule = "parallel-independent"
    """``parallel-independent``: every rollout on its own; ``sequential-shared``: one after
    another, each starting from the learner store its predecessor left (`reroll.jobs.learning`)."""
    store: Path | None = None
    """``sequential-shared`` only: the folder whose files are the store's generation 0 (a relative
    path in a job file is relative to the file's folder); None: an empty store."""
    skills: SkillMode = DEFAULT_SKILL_MODE
    """Every rollout's skill mode (`reroll.trials.config.SkillMode`)."""
    skills_dir: Path | None = None
    """``with-skill``: the folder of skills mounted for every task (a relative path in a job file
    is relative to the file's folder); None: each task's ``environment/skills``."""
    judge_model: str | None = None
    """An LLM judge's model for every rollout of a judged task; None: each task's."""
    ask_user: bool = False
    """Offer every rollout's agent reroll's ``ask_user`` tool over MCP (``reroll run --ask-user``,
    `reroll.rollout.turns.asks`); every agent of the job must have an MCP client. With no User (a job
    runs plain rollouts), the agent is told nobody answered."""
    without_mcp: bool = False
    """Run every rollout's agent without the tasks' MCP servers (``reroll run --without-mcp``): a
    baseline agent with no MCP client runs an MCP task instead of being refused."""
    user_model: str | None = None
    """A persona User's model for every rollout whose trial has one; None: the persona's ``model``."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Capture a checkpoint every this many steps of each rollout (``reroll run --checkpoint-every``);
    0: none (on local with copy-on-write, a pool checkpoint at every step anyway)."""
    checkpoint_keep: int = Field(default=DEFAULT_CHECKPOINT_KEEP, ge=0)
    """Keep a pool checkpoint at every step of each rollout on local with copy-on-write, at most
    this many (``--checkpoint-keep``); 0: off."""
    max_steps: int | None = Field(default=None, ge=1)
    """Cut each rollout once it served this many steps (``reroll run --max-steps``); None: no limit."""
    trial: Path | None = None
    """A trial file (a relative path in a job file is relative to the file's folder): every rollout
    runs its scenes, roles and turns, the rollout's agent and model playing the roles that name
    none (``reroll run --trial``); None: each agent told the task's instruction once."""

    def settings(self) -> RolloutSettings:
        """How every rollout of the job runs (`SETTINGS_KEYS`); a judge's and a User's
        ``scripted:PATH`` made absolute (`reroll.models.spec.resolved_spec`); ``sandbox_config``
        parsed by the backend's config model (once: call it once per job).

        Raises:
            FaultPlanError: the fault plan cannot be read (`reroll.host.llm_proxy.faults_used`).
            TaskError: the environment manifest is neither a file nor in the registry
                (`reroll.tasks.manifest.resolve_manifest`).
            SandboxBackendError: the backend is unknown or missing, or refuses ``sandbox_config``
                (the message names the backend and the field).
        """
        faults = faults_used(self.faults, self.fault_seed) if self.faults is not None else None
        return RolloutSettings(
            timeout_seconds=self.timeout_seconds,
            sandbox=self.sandbox,
            sandbox_config=load_backend(self.sandbox).settings(self.sandbox_config),
            network=self.network,
            environment_manifest=resolve_manifest(self.environment_manifest)
            if self.environment_manifest
            else None,
            environment_services=tuple(self.environment_services) if self.environment_services else None,
            faults=faults,
            checkpoint_every=self.checkpoint_every,
            checkpoint_keep=self.checkpoint_keep,
            max_steps=self.max_steps,
            skill_mode=self.skills,
            skills_dir=self.skills_dir,
            judge_model=resolved_spec(self.judge_model),
            ask_user=self.ask_user,
            without_mcp=self.without_mcp,
            user_model=resolved_spec(self.user_model),
        )

    def trial_config(self) -> TrialConfig | None:
        """The trial every rollout runs (`trial`, read), or None.

        Raises:
            TrialError: the trial file is missing or invalid.
        """
        return load_trial(self.trial) if self.trial is not None else None


def job_spec(data: dict[str, Any], source: str, base_dir: Path | None = None) -> JobSpec:
    """Validate `data` as a JobSpec, resolving relative task paths against `base_dir`.

    Args:
        data: the fields, e.g. a parsed job file merged with CLI flags.
        source: what to name in errors (a file, or "the command line").
        base_dir: folder relative task paths are taken from (default: the current one).

    Raises:
        JobError: a field is missing, unknown or invalid; the message names `source`.
    """
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise JobError(f"{source}: invalid job:\n{exc}") from exc
    if spec.fault_seed is not None and spec.faults is None:
        raise JobError(f"{source}: invalid job: fault_seed needs faults (a fault plan)")
    if spec.store is not None and spec.schedule != "sequential-shared":
        raise JobError(f"{source}: invalid job: store needs schedule sequential-shared")
    base = base_dir or Path.cwd()
    faults = (base / spec.faults).resolve() if spec.faults is not None else None
    store = (base / spec.store).resolve() if spec.store is not None else None
    tasks = [(base / task).resolve() for task in spec.tasks]
    skills_dir = (base / spec.skills_dir).resolve() if spec.skills_dir is not None else None
    trial = (base / spec.trial).resolve() if spec.trial is not None else None
    manifest = spec.environment_manifest
    if manifest is not None and (base / manifest).is_file():  # else a NAME[@VERSION] of the registry
        manifest = str((base / manifest).resolve())
    update = {"tasks": tasks, "faults": faults, "store": store, "skills_dir": skills_dir, "trial": trial}
    return spec.model_copy(update=update | {"environment_manifest": manifest})


def with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` (a job file's or job.json's fields) with `overrides` (CLI flags) applied: field by
    field, ``sandbox_config`` key by key."""
    merged = {**data, **overrides}
    if isinstance(data.get("sandbox_config"), dict) and "sandbox_config" in overrides:
        merged["sandbox_config"] = {**data["sandbox_config"], **overrides["sandbox_config"]}
    return merged


def load_job_file(path: Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a YAML (or JSON) job file, apply `overrides` (CLI flags), validate.

    Raises:
        JobError: the file is missing, not YAML, not a mapping, or invalid; the message names it.
    """
    raw = read_mapping(path, JobError, "job file", "tasks:, agents:, ...")
    return job_spec(with_overrides(raw, overrides or {}), str(path), path.resolve().parent)


def load_saved_spec(job_dir: Path) -> JobSpec:
    """The spec a job folder was started with (its ``job.json``), for ``--resume``.

    Raises:
        JobError: the folder has no job.json, or it is invalid.
    """
    file = JobPaths(job_dir).spec
    try:
        raw = orjson.loads(file.read_bytes())
    except FileNotFoundError as exc:
        raise JobError(f"{file}: missing; {job_dir} is not a job folder started by `reroll job`") from exc
    except orjson.JSONDecodeError as exc:
        raise JobError(f"{file}: invalid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise JobError(f"{file}: expected a JSON object")
    return job_spec(raw, str(file), job_dir)
