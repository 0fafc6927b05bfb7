"""A job's rollouts planned before anything runs: every (task, agent, model, repeat) expanded
(`plan_rollouts`), every task, agent, model and backend setting checked, and what the first
rollout of each (task, agent) pair would refuse refused here (`reroll.rollout.start.check_rollout`),
so a job that cannot run writes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import JobError

from reroll.agents import get_agent
from reroll.jobs.executors import REMOTE_EXECUTORS
from reroll.jobs.jobfile import JobSpec
from reroll.models.spec import model_slug, parse_model
from reroll.rollout.commands.record import new_recording
from reroll.rollout.start import check_rollout, load_runnable_task
from reroll.sandbox.base import WITHOUT_NETWORK_POLICY
from reroll.settings import RolloutSettings


@dataclass(frozen=True)
class PlannedRollout:
    """One rollout of a job: what runs, and the folder it runs into."""

    name: str
    """The run folder's name, ``<task>__<agent>__<model>__r<k>``."""
    task_path: Path
    task: str
    agent: str
    model: str | None
    """None for an agent that calls no model."""
    repeat: int
    """1-based repeat index."""


def plan_rollouts(spec: JobSpec, options: RolloutSettings | None = None) -> list[PlannedRollout]:
    """Expand `spec` into its rollouts, checking every task, agent and model first.

    An agent that calls no model runs once per (task, repeat), whatever `spec.models` holds.

    Args:
        spec: the job.
        options: ``spec.settings()`` when the caller has them already (the backend's settings
            are parsed there, once); None: made here.

    Raises:
        FaultPlanError: the fault plan cannot be read (`JobSpec.settings`).
        TaskError, AgentError, ModelError: a task folder, agent name or model spec is invalid; or
            what the first rollout of a (task, agent) pair refuses (`_refuse_unrunnable`): a task's
            judge model or a persona User's model that cannot be used, an MCP server the agent
            cannot take.
        SandboxBackendError: the sandbox backend is unknown, or its package is missing, or its
            settings (``sandbox_config``) are invalid.
        JobError: an agent calls a model but `spec.models` is empty, or network ``none`` is asked
            of the local backend.
        TaskError: also: the skill mode cannot run on a task (`reroll.rollout.skills.select_skills`).
        JobError: also: a ``sequential-shared`` job on an executor whose rollouts run on other
            machines (``ray``): each rollout starts from the store generation the one before it
            left and writes the next one into the job folder, so they run one at a time against
            the controller's store — Ray would add a round trip of the store per rollout and no
            parallelism; or a trial on such an executor (its files do not travel).
    """
    if spec.schedule == "sequential-shared" and spec.executor in REMOTE_EXECUTORS:
        raise JobError(
            f"schedule sequential-shared cannot run on the {spec.executor} executor: its rollouts run "
            "one at a time, each from the learner store the one before it left in the job folder on "
            "this machine; use --executor asyncio (on a machine with the sandbox backend)"
        )
    if spec.trial is not None and spec.executor in REMOTE_EXECUTORS:
        raise JobError(
            f"a job's trial runs on the asyncio executor only: its files (the trial, its scripts and "
            f"Users) do not travel to {spec.executor} workers; use --executor asyncio"
        )
    options = spec.settings() if options is None else options  # the backend's settings parsed
    if spec.network == "none" and spec.sandbox in WITHOUT_NETWORK_POLICY:
        raise JobError(
            f"network none needs sandbox local or docker: the {spec.sandbox} sandbox has the host's network"
        )
    tasks = [load_runnable_task(path) for path in spec.tasks]
    agents = [get_agent(name) for name in spec.agents]
    planned = []
    for task in tasks:
        for agent in agents:
            for spec_model in spec.models:
                parse_model(spec_model, task.path, agent.name)
            models: list[str | None] = [None] if agent.api_format == "none" else list(spec.models)
            if not models:
                raise JobError(f"agent {agent.name!r} calls a model: give the job models (--model)")
            for model in models:
                for repeat in range(1, spec.repeats + 1):
                    name = f"{task.name}__{agent.name}__{model_slug(model)}__r{repeat}"
                    planned.append(PlannedRollout(name, task.path, task.name, agent.name, model, repeat))
    _refuse_unrunnable(spec, planned, options)
    return planned


def _refuse_unrunnable(spec: JobSpec, planned: list[PlannedRollout], options: RolloutSettings) -> None:
    """Refuse, before anything is written, what the first rollout of each (task, agent) pair would
    refuse (`reroll.rollout.start.check_rollout`: skills, the judge's and a persona User's models,
    the MCP servers the agent must take …) — found there, every rollout of the pair would end in
    error.

    Raises:
        RerollError: as `reroll.rollout.start.start_rollout`.
    """
    trial = spec.trial_config()
    checked: set[tuple[Path, str]] = set()
    for rollout in planned:
        if (rollout.task_path, rollout.agent) in checked:
            continue
        checked.add((rollout.task_path, rollout.agent))
        origin, live = new_recording(
            rollout.task_path, agent_name=rollout.agent, model=rollout.model, trial=trial
        )
        check_rollout(origin, live_model=live, options=options)
