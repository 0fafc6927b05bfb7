"""``reroll run``: record one rollout of an agent on a task (`run_task`).

A recording is the rollout with nothing to replay: `reroll.continuation.start_rollout` from a
`NewRecording`, into ``<jobs_dir>/<job_name>/<run_name>``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from reroll.agents import get_agent
from reroll.continuation import NewRecording, RolloutOptions, RolloutOutcome, model_for, start_rollout
from reroll.rollout import new_run_id
from reroll.tasks import load_task


async def run_task(
    task_path: Path,
    *,
    agent_name: str,
    model: str | None = None,
    options: RolloutOptions = RolloutOptions(),
    jobs_dir: Path = Path("jobs"),
    job_name: str | None = None,
    run_name: str | None = None,
    console: Console | None = None,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Record one rollout of `agent_name` on the task at `task_path` (``reroll run``).

    Args:
        task_path: the task folder.
        agent_name: an agent of the registry (``reroll agents``).
        model: the live model spec (see `reroll.models`); required unless the agent calls none.
        options: how the rollout runs (timeout [default: the task's], sandbox [default:
            ``local``], network [default: the task's], faults).
        jobs_dir: where job folders go.
        job_name: the job folder's name [default: the start time].
        run_name: the run folder's name [default: ``<task>__<random id>``].
        console: where progress goes [default: ``harness/controller.log`` in the run folder].
        start_gate: held while the model server, proxy and sandbox start (see
            `reroll.continuation.start_rollout`).

    Returns:
        The new run folder (``jobs_dir/job_name/run_name``) and its result.

    Raises:
        TaskError, AgentError, ModelError, SandboxBackendError: bad input (a missing provider
            key, an unknown sandbox backend …), before anything is written.
    """
    task = load_task(task_path)
    agent = get_agent(agent_name)
    live_model = model_for(agent, model, task)
    job = job_name or datetime.now(UTC).strftime("%Y-%m-%d__%H-%M-%S")
    return await start_rollout(
        NewRecording(task, agent),
        live_model=live_model,
        parent=jobs_dir / job,
        name=run_name or f"{task.name}__{new_run_id()}",
        options=options,
        console=console,
        start_gate=start_gate,
    )
