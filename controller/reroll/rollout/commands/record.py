"""``reroll run``: record one rollout of an agent on a task (`run_task`).

A recording is the rollout with nothing to replay: `reroll.rollout.start.start_rollout` from a
`NewRecording`, into ``<jobs_dir>/<job_name>/<run_name>``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from reroll_contracts.errors import AgentError, TaskError
from rich.console import Console

from reroll.agents import get_agent
from reroll.models.spec import ModelSpec
from reroll.rollout.lifecycle import new_run_id
from reroll.rollout.start import NewRecording, RolloutOutcome, load_runnable_task, model_for, start_rollout
from reroll.settings import RolloutSettings
from reroll.trials.config import TrialConfig


async def run_task(
    task_path: Path | None = None,
    *,
    agent_name: str | None = None,
    model: str | None = None,
    trial: TrialConfig | None = None,
    options: RolloutSettings = RolloutSettings(),
    jobs_dir: Path = Path("jobs"),
    job_name: str | None = None,
    run_name: str | None = None,
    console: Console | None = None,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Record one rollout of `agent_name` (or of `trial`) on the task at `task_path` (``reroll run``).

    Args:
        task_path: the task folder [default: the trial's ``task``].
        agent_name: an agent of the registry (``reroll agents``); with a trial, the agent of its
            roles that name none.
        model: the live model spec (see `reroll.models.spec`); required unless the agent calls none.
            With a trial it wins over its roles' models.
        trial: the scenes, roles and turns (`reroll.trials.config`; `reroll.trials.config.load_trial` reads a
            trial file); None: `agent_name` told the task's instruction once.
        options: how the rollout runs (timeout [default: the task's], sandbox [default:
            ``local``], network [default: the task's], faults).
        jobs_dir: where job folders go.
        job_name: the job folder's name [default: the start time].
        run_name: the run folder's name [default: ``<task>__<random id>``].
        console: where progress goes [default: ``harness/controller.log`` in the run folder].
        start_gate: held while the model server, proxy and sandbox start (see
            `reroll.rollout.start.start_rollout`).

    Returns:
        The new run folder (``jobs_dir/job_name/run_name``) and its result.

    Raises:
        TaskError, AgentError, ModelError, SandboxBackendError, TrialError: bad input (a missing
            provider key, an unknown sandbox backend, no task, no agent …), before anything is written.
    """
    origin, live_model = new_recording(task_path, agent_name=agent_name, model=model, trial=trial)
    job = job_name or datetime.now(UTC).strftime("%Y-%m-%d__%H-%M-%S")
    return await start_rollout(
        origin,
        live_model=live_model,
        parent=jobs_dir / job,
        name=run_name or f"{origin.task.name}__{new_run_id()}",
        options=options,
        console=console,
        start_gate=start_gate,
    )


def new_recording(
    task_path: Path | None, *, agent_name: str | None, model: str | None, trial: TrialConfig | None
) -> tuple[NewRecording, ModelSpec | None]:
    """Where a recording of `agent_name` (or of `trial`) on the task at `task_path` starts, and its
    live model (arguments as `run_task`'s); ``reroll job`` checks each (task, agent) pair with it
    before anything runs (`reroll.rollout.start.check_rollout`).

    Raises:
        TaskError, AgentError, ModelError: no task or agent, or one that cannot be loaded; no model
            for an agent that calls one, or one that cannot be resolved.
    """
    path = task_path or (trial.task if trial is not None else None)
    if path is None:
        raise TaskError("no task: name a task folder (or a trial file whose `task:` names one)")
    task = load_runnable_task(path)
    if trial is not None:
        trial = trial.resolved(agent_name, model)
        agent_name, model = trial.agents[0], trial.model
    if agent_name is None:
        raise AgentError("no agent: pass --agent (see `reroll agents`)")
    agent = get_agent(agent_name)
    return NewRecording(task, agent, trial), model_for(agent, model, task)
