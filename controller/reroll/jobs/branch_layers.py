"""How a branch's children reach the cut (`tree_via`, `choose_via`: by snapshot or by replay), and
where they get step K's checkpoint layers from: a checkpoint the run recorded (`recorded_layers`:
of K, or of the nearest earlier step whose pool snapshot is kept), else the prefix rebuilt once by
a replay-only rollout that captures them (`rebuilt_layers`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reroll_contracts.errors import EnvironmentStateError
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.jobs.branch_points import BranchPoint
from reroll.rollout.checkpoint import Checkpoint
from reroll.rollout.extensions.checkpoints import kept_pool
from reroll.rollout.layers import load_checkpoint
from reroll.rollout.start import FromCheckpoint, start_rollout
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.summary import Via
from reroll.settings import RolloutSettings

PREFIX_NAME = "_prefix"
"""The replay-only rollout that rebuilds the prefix once (``via = "snapshot"``), in the parent."""


async def rebuilt_layers(
    checkpoint: Checkpoint, parent: Path, options: RolloutSettings, console: Console, *, process: bool = False
) -> tuple[Path, str]:
    """The checkpoint folder of step K the children fork from when the run recorded none usable
    (`recorded_layers`), and where it came from: the prefix rebuilt once by a replay-only rollout
    (`PREFIX_NAME`) that captures it when the proxy holds the agent's request at the cut
    (``_prefix/checkpoints/step-K``); with `process`, the agent's process tree dumped there too
    (`reroll.rollout.process_layer`).

    Raises:
        EnvironmentStateError: the rebuilt prefix left no consistent checkpoint (its result named).
    """
    console.print(f"rebuilding the prefix once (replay-only, {PREFIX_NAME}/) and capturing its layers")
    outcome = await start_rollout(
        FromCheckpoint(checkpoint, checkpoint.continued_from(None, replay_only=True), dump_process=process),
        live_model=None,
        parent=parent,
        name=PREFIX_NAME,
        options=options.model_copy(
            update={"checkpoint_every": checkpoint.cut_index}
        ),  # held at the cut: captured
    )
    captured = RunPaths(outcome.run_dir).checkpoint(checkpoint.cut_index)
    if not captured.record.is_file():
        result = outcome.result
        raise EnvironmentStateError(
            f"rebuilding the prefix to step {checkpoint.cut_index} captured no checkpoint: "
            f"{PREFIX_NAME} ended {result.status} ({result.error_category}: {result.error}); "
            f"see {RunPaths(outcome.run_dir).controller_log}"
        )
    return captured.root, f"the prefix rebuilt once in {PREFIX_NAME}/"


def recorded_layers(
    checkpoint: Checkpoint, sandbox: str, console: Console
) -> tuple[Path, int, str | None, str | None] | None:
    """The checkpoint recorded during the run the children fork from, nearest the cut: of the cut
    itself when it is consistent and complete or its pool is kept, else of the nearest earlier
    step J (> 0) whose pool snapshot is kept (`kept_pool`: ``local``) — the children start from
    it and replay steps J..K. As (folder, step, pool reference or None, note on the pool); None
    when there is none (the prefix is rebuilt once: `rebuilt_layers`)."""
    cut, recorded = checkpoint.cut_index, RunPaths(checkpoint.original.path)
    for step in sorted((step for step in recorded.checkpoint_steps() if 0 < step <= cut), reverse=True):
        files = recorded.checkpoint(step)
        folder = files.root
        if not files.record.is_file():
            continue
        try:
            layers = load_checkpoint(folder, step=step)
        except EnvironmentStateError as exc:
            console.print(f"[yellow]{exc}; not forking from it[/yellow]")
            continue
        pool, note = kept_pool(folder, sandbox)
        if pool is not None or (
            step == cut and "sandbox" in layers.expected
        ):  # a pool-only one needs its pool
            return folder, step, pool, note if step == cut else f"{note}; replaying steps {step}..{cut}"
    return None


def choose_via(agent: AgentSpec, via: Via | None, process_refusal: str | None) -> tuple[Via, str | None]:
    """How branches of `agent` reach the cut, and a note: why it is not a snapshot, or that the
    snapshot holds the agent's process tree.

    Args:
        agent: the run's agent.
        via: asked for (``--via``); None: snapshot where the agent has a resumable session
            (`AgentSpec.forkable`); an agent forked by a process checkpoint
            (`AgentSpec.process_checkpoint`) only when asked for (CRIU is downloaded on first use
            and a checkpoint holds its heap: about 180 MB for mini-swe-agent).
        process_refusal: why a process checkpoint cannot fork the agent where the branches run
            (`reroll.rollout.process_layer.process_fork_refusal`), None when it can.
    """
    if via == "replay":
        return "replay", None
    if agent.forkable:
        return "snapshot", None
    if agent.process_checkpoint and via == "snapshot" and process_refusal is None:
        return "snapshot", f"{agent.name}'s process tree checkpointed at the cut (CRIU)"
    if agent.process_checkpoint:
        why = process_refusal or "a process checkpoint (CRIU) is taken with --via snapshot only"
        return "replay", (
            f"{agent.name} keeps its conversation in its memory: its branches replay the prefix "
            f"({why}; docs/branch.md)"
        )
    return "replay", (
        f"{agent.name} has no resumable session (no `resume` and `session_paths` in its declaration) "
        "and is not declared `process_checkpoint`: its branches replay the prefix (docs/branch.md)"
    )


def tree_via(
    checkpoint: Checkpoint,
    points: Sequence[BranchPoint],
    at_ask: int | None,
    via: Via | None,
    process_refusal: str | None,
) -> tuple[Via, str | None]:
    """How the children reach the cut (`choose_via`), and why when not as asked: ``replay`` at step
    0, for a trial, and for several points, a varied prompt or an ask_user answer."""
    chosen, note = choose_via(checkpoint.agent, via, process_refusal)
    if chosen == "snapshot" and checkpoint.cut_index == 0:
        return "replay", "step 0: nothing to replay, nothing to fork"
    if chosen == "snapshot" and checkpoint.original.config.trial is not None:
        return "replay", "a trial (its turns, roles and Users) is not forked by snapshot yet"
    if chosen == "snapshot" and (len(points) > 1 or points[0].prompt is not None or at_ask is not None):
        return "replay", "several branch points, a varied prompt or an ask_user answer fork by replay"
    return chosen, note
