"""`reroll run` and `reroll continue`: build a `RolloutPlan` from CLI input and execute it.

A continuation (seeds/continue-timed-out-runs.txt) boots a fresh sandbox from the same task and
launches the same agent with the original prompt; the proxy serves the recorded responses in
order, so the agent re-executes its own past steps for real, then cuts over to the live model.
The new run folder gets the stitched trajectory and ``continued_from`` provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from reroll import __version__
from reroll.agents import get_agent
from reroll.errors import RunFolderError, TaskError
from reroll.llm_proxy import DivergencePolicy, ReplayPlan
from reroll.models import ModelSpec, parse_model
from reroll.rollout import RolloutPlan, execute_rollout, new_run_id
from reroll.runfolder import ContinuedFrom, RunConfig, RunResult, create_run_folder, load_run_folder, now_iso
from reroll.tasks import Task, find_task, load_task


@dataclass(frozen=True)
class RolloutOutcome:
    """A finished rollout: where its folder is and what result.json says."""

    run_dir: Path
    result: RunResult


async def run_task(
    task_path: Path,
    *,
    agent_name: str,
    model: str | None,
    timeout_seconds: float | None,
    jobs_dir: Path,
    job_name: str | None,
    sandbox: str,
    console: Console,
    run_name: str | None = None,
) -> RolloutOutcome:
    """Record one rollout of `agent_name` on the task at `task_path` (``reroll run``).

    The run folder is ``jobs_dir/job_name/run_name`` (default name: ``<task>__<random id>``).

    Raises:
        TaskError, AgentError, ModelError: bad input, before anything is written.
    """
    task = load_task(task_path)
    agent = get_agent(agent_name)
    live_model = _model_for(agent.api_format, model, task)
    timeout = timeout_seconds if timeout_seconds is not None else task.spec.agent.timeout_sec
    job = job_name or datetime.now(UTC).strftime("%Y-%m-%d__%H-%M-%S")
    run_dir = create_run_folder(jobs_dir / job, run_name or f"{task.name}__{new_run_id()}")
    config = RunConfig(
        task_path=str(task.path),
        task_name=task.name,
        agent=agent.name,
        model=live_model.spec if live_model else None,
        timeout_sec=timeout,
        started_at=now_iso(),
        sandbox=sandbox,
        reroll_version=__version__,
    )
    plan = RolloutPlan(
        task=task,
        agent=agent,
        prompt=task.instruction,
        agent_model=live_model.name if live_model else "",
        live_model=live_model,
        timeout_seconds=timeout,
        run_dir=run_dir,
        config=config,
        sandbox_backend=sandbox,
    )
    console.print(f"run folder: {run_dir}")
    return RolloutOutcome(run_dir, await execute_rollout(plan, console))


async def continue_run(
    run_folder: Path,
    *,
    tasks_dir: Path | None,
    model: str | None,
    timeout_seconds: float | None,
    output: Path | None,
    require_timeout: bool,
    divergence_policy: DivergencePolicy,
    replay_only: bool,
    sandbox: str | None,
    console: Console,
) -> RolloutOutcome:
    """Continue a recorded run (``reroll continue``); see the module docstring.

    Raises:
        RunFolderError: the folder is missing or corrupt, or `require_timeout` is set and the run
            did not time out.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
    """
    original = load_run_folder(run_folder)
    if original.trajectory.warning:
        console.print(f"[yellow]warning:[/yellow] {original.trajectory.warning}")
    status = original.result.effective_status if original.result else "unknown"
    if require_timeout and status != "timeout":
        raise RunFolderError(f"{original.path}: status is {status!r}, not 'timeout' (--require-timeout)")
    task = _find_original_task(original.config, tasks_dir)
    agent = get_agent(original.config.agent)
    live_spec = None if replay_only else (model or original.config.model)
    live_model = _model_for(agent.api_format, live_spec, task) if live_spec else None
    original_model = parse_model(original.config.model, task.path) if original.config.model else None
    cut_index = len(original.exchanges)
    timeout = timeout_seconds or original.config.timeout_sec or task.spec.agent.timeout_sec
    output_dir = output or original.path.parent / "continued"
    run_dir = create_run_folder(output_dir, original.path.name)
    config = original.config.model_copy(
        update={
            "model": live_model.spec if live_model else original.config.model,
            "timeout_sec": timeout,
            "started_at": now_iso(),
            "sandbox": sandbox or original.config.sandbox,
            "reroll_version": __version__,
            "continued_from": ContinuedFrom(
                path=str(original.path),
                status=status,
                cut_index=cut_index,
                original_model=original.config.model,
                live_model=live_model.spec if live_model else None,
                replay_only=replay_only,
            ),
        }
    )
    plan = RolloutPlan(
        task=task,
        agent=agent,
        prompt=original.prompts[0] if original.prompts else task.instruction,
        agent_model=original_model.name if original_model else "",
        live_model=live_model,
        timeout_seconds=timeout,
        run_dir=run_dir,
        config=config,
        sandbox_backend=sandbox or original.config.sandbox,
        replay=ReplayPlan(
            trajectory_path=original.path / "trajectory" / "llm_trajectory.jsonl",
            cut_index=cut_index,
            divergence_policy=divergence_policy,
        ),
    )
    console.print(f"continuing {original.path} ({status}, {cut_index} recorded exchanges)")
    console.print(f"run folder: {run_dir}")
    return RolloutOutcome(run_dir, await execute_rollout(plan, console))


def _model_for(api_format: str, model: str | None, task: Task) -> ModelSpec | None:
    if api_format == "none":
        return None
    if model is None:
        raise TaskError("this agent calls a model: pass --model (e.g. --model scripted)")
    return parse_model(model, task.path)


def _find_original_task(config: RunConfig, tasks_dir: Path | None) -> Task:
    name = config.task_name or Path(config.task_path).name
    if tasks_dir is not None:
        return find_task(name, tasks_dir)
    if Path(config.task_path).is_dir():
        return load_task(Path(config.task_path))
    raise TaskError(
        f"task {config.task_path} no longer exists; pass --tasks-dir with a folder holding {name!r}"
    )
