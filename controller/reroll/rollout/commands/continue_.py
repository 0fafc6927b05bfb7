"""``reroll continue``: `continue_run` resumes a recorded run in a fresh sandbox.

A continuation (seeds/continue-timed-out-runs.txt) boots a fresh sandbox from the same task and
launches the same agent with the original prompt; the proxy serves the recorded responses in
order, so the agent re-executes its own past steps for real, then cuts over to the live model.
The new run folder gets the stitched trajectory and ``continued_from`` provenance. With a
checkpoint (``--at K``, see `reroll.rollout.checkpoint`) only the first K exchanges are replayed,
so a finished run can be continued from any step, by the same model or another. It starts the
rollout through `reroll.rollout.start.start_rollout`, the path of every rollout.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from reroll.models.spec import ModelSpec
from reroll.rollout.checkpoint import At, open_checkpoint
from reroll.rollout.start import FromCheckpoint, RolloutOutcome, check_rollout, model_for, start_rollout
from reroll.runfolder.paths import RunPaths
from reroll.settings import RolloutSettings


async def continue_run(
    run_folder: Path,
    *,
    at: At | None = None,
    model: str | None = None,
    agent: str | None = None,
    replay_only: bool = False,
    require_timeout: bool = False,
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
    output: Path | None = None,
    console: Console | None = None,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Continue a recorded run (``reroll continue``); see the module docstring.

    Args:
        run_folder: the recorded run.
        at: the checkpoint (a step index or a fraction, see `reroll.rollout.checkpoint`); None replays
            every recorded exchange (a timed-out run's cut point).
        model: the live model after the cut [default: the original's]; with `at`, this swaps the
            model mid-run.
        agent: the agent that replays and continues [default: the recorded one].
        replay_only: stop at the cut point (no live model, no verifier).
        require_timeout: refuse runs whose status is not ``timeout``.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        options: how the continuation runs (timeout, sandbox, network, faults, divergence policy).
        output: jobs dir of the new run folder [default: ``<original's parent>/continued``].
        console: where progress goes [default: ``harness/controller.log`` in the new run folder].
        start_gate: held while the model server, proxy and sandbox start (see `start_rollout`).

    Returns:
        The new run folder and its result.

    Raises:
        RunFolderError: the folder is missing or corrupt, `at` is malformed or out of range, or
            `require_timeout` is set and the run did not time out.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        ModelError: the live model cannot be resolved, or its provider's key is missing.
        SandboxBackendError: the sandbox backend is unknown, or its package is missing.
        Nothing is written when any of these is raised.
    """
    origin, live_model = _continuation(
        run_folder,
        at,
        model,
        agent,
        replay_only=replay_only,
        require_timeout=require_timeout,
        tasks_dir=tasks_dir,
        console=console,
    )
    return await start_rollout(
        origin,
        live_model=live_model,
        parent=output or RunPaths(origin.checkpoint.original.path).beside("continued"),
        name=origin.checkpoint.original.path.name,
        options=options,
        console=console,
        start_gate=start_gate,
    )


def check_continuation(
    run_folder: Path,
    *,
    model: str | None = None,
    require_timeout: bool = False,
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
) -> None:
    """Refuse what `continue_run` of the same arguments would refuse, writing nothing and starting
    nothing: the run folder, the task, the live model, and every check of
    `reroll.rollout.start.check_rollout` (the judge's and User's models, MCP, skills …). A command
    that continues many runs (``reroll continue-job``) calls it for each before the first starts.

    Raises:
        As `continue_run`.
    """
    origin, live_model = _continuation(
        run_folder, None, model, None, replay_only=False, require_timeout=require_timeout, tasks_dir=tasks_dir
    )
    check_rollout(origin, live_model=live_model, options=options)


def _continuation(
    run_folder: Path,
    at: At | None,
    model: str | None,
    agent: str | None,
    *,
    replay_only: bool,
    require_timeout: bool,
    tasks_dir: Path | None,
    console: Console | None = None,
) -> tuple[FromCheckpoint, ModelSpec | None]:
    """The continuation's origin (the checkpoint and its ``continued_from`` provenance) and its
    live model (None with `replay_only`)."""
    checkpoint = open_checkpoint(
        run_folder, at=at, tasks_dir=tasks_dir, require_timeout=require_timeout, console=console, agent=agent
    )
    live_spec = None if replay_only else (model or checkpoint.original.config.model)
    live_model = model_for(checkpoint.agent, live_spec, checkpoint.task) if live_spec else None
    original = checkpoint.original
    if console is not None:
        where = "" if at is None else f", cut at {checkpoint.cut_index} (--at {at})"
        console.print(
            f"continuing {original.path} ({checkpoint.status}, {len(original.exchanges)} recorded "
            f"exchanges{where})"
        )
    provenance = checkpoint.continued_from(live_model.spec if live_model else None, replay_only=replay_only)
    return FromCheckpoint(checkpoint, provenance), live_model
