"""`reroll run` and `reroll continue`: build a `RolloutPlan` from CLI input and execute it.

A continuation (seeds/continue-timed-out-runs.txt) boots a fresh sandbox from the same task and
launches the same agent with the original prompt; the proxy serves the recorded responses in
order, so the agent re-executes its own past steps for real, then cuts over to the live model.
The new run folder gets the stitched trajectory and ``continued_from`` provenance. With a
checkpoint (``--at K``, see `reroll.checkpoint`) only the first K exchanges are replayed, so a
finished run can be continued from any step, by the same model or another.

`open_checkpoint` and `continuation_plan` are shared with ``reroll replay`` (`reroll.fidelity`)
and ``reroll branch`` (`reroll.branching`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from reroll import __version__
from reroll.agents import AgentSpec, get_agent
from reroll.checkpoint import At, resolve_cut
from reroll.errors import RunFolderError, TaskError
from reroll.llm_proxy import DivergencePolicy, ReplayPlan
from reroll.models import ModelSpec, model_name, parse_model
from reroll.rollout import RolloutPlan, execute_rollout, new_run_id
from reroll.runfolder import (
    TRAJECTORY,
    ContinuedFrom,
    FaultsUsed,
    RunConfig,
    RunFolder,
    RunResult,
    create_run_folder,
    load_run_folder,
    now_iso,
)
from reroll.sandbox.base import WITHOUT_NETWORK_POLICY
from reroll.tasks import NetworkPolicy, Task, find_task, load_task, with_network


@dataclass(frozen=True)
class RolloutOutcome:
    """A finished rollout: where its folder is and what result.json says."""

    run_dir: Path
    result: RunResult


async def run_task(
    task_path: Path,
    *,
    agent_name: str,
    model: str | None = None,
    timeout_seconds: float | None = None,
    jobs_dir: Path = Path("jobs"),
    job_name: str | None = None,
    sandbox: str = "local",
    network: NetworkPolicy | None = None,
    console: Console | None = None,
    run_name: str | None = None,
    faults: FaultsUsed | None = None,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Record one rollout of `agent_name` on the task at `task_path` (``reroll run``).

    Args:
        task_path: the task folder.
        agent_name: an agent of the registry (``reroll agents``).
        model: the live model spec (see `reroll.models`); required unless the agent calls none.
        timeout_seconds: the agent's wall-clock budget [default: the task's].
        jobs_dir: where job folders go.
        job_name: the job folder's name [default: the start time].
        sandbox: sandbox backend.
        network: the sandbox's network policy [default: the task's ``environment.network``];
            ``none`` needs a container backend.
        console: where progress goes [default: nowhere].
        run_name: the run folder's name [default: ``<task>__<random id>``].
        faults: the fault plan the proxy injects (`reroll.llm_proxy.faults_used`), or None.
        start_gate: held while the model server, proxy and sandbox start (see `RolloutPlan`).

    Returns:
        The new run folder (``jobs_dir/job_name/run_name``) and its result.

    Raises:
        TaskError, AgentError, ModelError: bad input, before anything is written.
    """
    console = console or Console(quiet=True)
    if network == "none" and sandbox in WITHOUT_NETWORK_POLICY:
        raise TaskError("--network none needs --sandbox docker: the local sandbox has the host's network")
    task = with_network(load_task(task_path), network)
    agent = get_agent(agent_name)
    live_model = model_for(agent.api_format, model, task)
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
        network=network,
        reroll_version=__version__,
        faults=faults,
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
        start_gate=start_gate,
    )
    console.print(f"run folder: {run_dir}")
    return RolloutOutcome(run_dir, await execute_rollout(plan, console))


async def continue_run(
    run_folder: Path,
    *,
    at: At | None = None,
    model: str | None = None,
    tasks_dir: Path | None = None,
    timeout_seconds: float | None = None,
    output: Path | None = None,
    require_timeout: bool = False,
    divergence_policy: DivergencePolicy = "warn",
    replay_only: bool = False,
    sandbox: str | None = None,
    console: Console | None = None,
    faults: FaultsUsed | None = None,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Continue a recorded run (``reroll continue``); see the module docstring.

    Args:
        run_folder: the recorded run.
        at: the checkpoint (a step index or a fraction, see `reroll.checkpoint`); None replays
            every recorded exchange (a timed-out run's cut point).
        model: the live model after the cut [default: the original's]; with `at`, this swaps the
            model mid-run.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        timeout_seconds: wall-clock budget of the new rollout [default: the original's].
        output: jobs dir of the new run folder [default: ``<original's parent>/continued``].
        require_timeout: refuse runs whose status is not ``timeout``.
        divergence_policy: what the proxy does when a replayed request differs from the recording.
        replay_only: stop at the cut point (no live model, no verifier).
        sandbox: sandbox backend [default: the original's].
        console: where progress goes [default: nowhere].
        faults: the fault plan the proxy injects, or None; recorded faults are replayed as they
            were either way.
        start_gate: held while the model server, proxy and sandbox start (see `RolloutPlan`).

    Returns:
        The new run folder and its result.

    Raises:
        RunFolderError: the folder is missing or corrupt, `at` is malformed or out of range, or
            `require_timeout` is set and the run did not time out.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        ModelError: the live model cannot be resolved.
    """
    console = console or Console(quiet=True)
    checkpoint = open_checkpoint(
        run_folder, tasks_dir=tasks_dir, at=at, console=console, require_timeout=require_timeout
    )
    live_spec = None if replay_only else (model or checkpoint.original.config.model)
    live_model = model_for(checkpoint.agent.api_format, live_spec, checkpoint.task) if live_spec else None
    original = checkpoint.original
    run_dir = create_run_folder(output or original.path.parent / "continued", original.path.name)
    provenance = ContinuedFrom(
        path=str(original.path),
        status=checkpoint.status,
        cut_index=checkpoint.cut_index,
        at=None if at is None else str(at),
        original_model=original.config.model,
        live_model=live_model.spec if live_model else None,
        replay_only=replay_only,
    )
    plan = continuation_plan(
        checkpoint,
        run_dir=run_dir,
        live_model=live_model,
        timeout_seconds=timeout_seconds,
        sandbox=sandbox,
        divergence_policy=divergence_policy,
        provenance={"continued_from": provenance},
        faults=faults,
    )
    recorded = len(original.exchanges)
    where = "" if at is None else f", cut at {checkpoint.cut_index} (--at {at})"
    console.print(f"continuing {original.path} ({checkpoint.status}, {recorded} recorded exchanges{where})")
    console.print(f"run folder: {run_dir}")
    return RolloutOutcome(run_dir, await execute_rollout(replace(plan, start_gate=start_gate), console))


@dataclass(frozen=True)
class Checkpoint:
    """A recorded run opened for replay up to a cut index."""

    original: RunFolder
    task: Task
    agent: AgentSpec
    status: str
    """The original's status (``ok``, ``timeout``, ``error``, or ``unknown`` without result.json)."""
    cut_index: int
    """How many recorded exchanges are replayed before the live model takes over."""
    agent_model: str
    """The model name the original agent asked for (a continuation keeps it)."""


def open_checkpoint(
    run_folder: Path,
    *,
    tasks_dir: Path | None,
    at: At | None,
    console: Console,
    require_timeout: bool = False,
) -> Checkpoint:
    """Load `run_folder`, find its task and agent, and resolve `at` to a cut index.

    Raises:
        RunFolderError: the folder is missing or corrupt, `at` is malformed or out of range, or
            `require_timeout` is set and the run's status is not ``timeout``.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        AgentError: the recorded agent is unknown.
    """
    original = load_run_folder(run_folder)
    if original.trajectory.warning:
        console.print(f"[yellow]warning:[/yellow] {original.trajectory.warning}")
    cut_index = resolve_cut(at, len(original.exchanges), original.path)
    status = original.result.effective_status if original.result else "unknown"
    if require_timeout and status != "timeout":
        raise RunFolderError(f"{original.path}: status is {status!r}, not 'timeout' (--require-timeout)")
    task = _find_original_task(original.config, tasks_dir)
    agent = get_agent(original.config.agent)
    agent_model = model_name(original.config.model) if original.config.model else ""
    return Checkpoint(original, task, agent, status, cut_index, agent_model)


def continuation_plan(
    checkpoint: Checkpoint,
    *,
    run_dir: Path,
    live_model: ModelSpec | None,
    timeout_seconds: float | None,
    sandbox: str | None,
    divergence_policy: DivergencePolicy,
    provenance: dict[str, BaseModel],
    replay_from: Path | None = None,
    faults: FaultsUsed | None = None,
) -> RolloutPlan:
    """The plan of a rollout that replays `checkpoint` up to its cut, then goes live.

    Args:
        checkpoint: the recorded run and the cut.
        run_dir: the new, empty run folder.
        live_model: the model after the cut, or None (replay only).
        timeout_seconds: wall-clock budget [default: the original's, else the task's].
        sandbox: sandbox backend [default: the original's].
        divergence_policy: the proxy's policy for replayed requests that differ from the recording.
        provenance: config.json fields to set, e.g. ``{"continued_from": ContinuedFrom(...)}``.
        replay_from: the trajectory to replay [default: the original's]; it must hold at least
            ``checkpoint.cut_index`` exchanges.
        faults: the fault plan of the new rollout (the original's is not inherited), or None.
    """
    original = checkpoint.original
    timeout = timeout_seconds or original.config.timeout_sec or checkpoint.task.spec.agent.timeout_sec
    backend = sandbox or original.config.sandbox
    config = original.config.model_copy(
        update={
            "model": live_model.spec if live_model else original.config.model,
            "timeout_sec": timeout,
            "started_at": now_iso(),
            "sandbox": backend,
            "reroll_version": __version__,
            "continued_from": None,
            "branched_from": None,
            "faults": faults,
            **provenance,
        }
    )
    return RolloutPlan(
        task=with_network(checkpoint.task, original.config.network),
        agent=checkpoint.agent,
        prompt=original.prompts[0] if original.prompts else checkpoint.task.instruction,
        agent_model=checkpoint.agent_model,
        live_model=live_model,
        timeout_seconds=timeout,
        run_dir=run_dir,
        config=config,
        sandbox_backend=backend,
        replay=ReplayPlan(
            trajectory_path=replay_from or original.path / TRAJECTORY,
            cut_index=checkpoint.cut_index,
            divergence_policy=divergence_policy,
        ),
    )


def model_for(api_format: str, model: str | None, task: Task) -> ModelSpec | None:
    """The parsed live model for an agent speaking `api_format` (None for agents that call none).

    Raises:
        TaskError: the agent calls a model and `model` is None.
        ModelError: `model` cannot be parsed (see `reroll.models.parse_model`).
    """
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
