"""``reroll branch RUN --at K --model A [--model B …] [-n N]``: many continuations of one checkpoint.

Every branch replays the first K recorded exchanges — so its fresh sandbox reaches the state the
original run had at step K — then continues live with its model, and is verified. N branches
per model run concurrently (each in its own sandbox, at most `concurrency` at a time). The mean
reward of a model's branches estimates the value of the checkpoint state under that model.

The output is a tree::

    <output>/<run>/                     the parent: the shared prefix, itself a loadable run folder
      config.json                       the original's, with branched_from (path = the original run)
      prompts.json
      trajectory/llm_trajectory.jsonl   the first K recorded exchanges
      summary.json                      BranchSummary: per-child rewards, mean reward per model
      <model>__<i>/                     one run folder per branch, branched_from.path = the parent
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console

from reroll.checkpoint import At
from reroll.errors import AgentError
from reroll.llm_proxy import DivergencePolicy
from reroll.models import ModelSpec, parse_model
from reroll.resume import Checkpoint, continuation_plan, open_checkpoint
from reroll.rollout import execute_rollout
from reroll.runfolder import TRAJECTORY, BranchedFrom, RunResult, create_run_folder, now_iso, write_json

SUMMARY = "summary.json"


class ChildSummary(BaseModel):
    """One branch's outcome."""

    folder: str
    """The child run folder's name, inside the parent folder."""
    model: str
    branch_index: int
    """Which continuation of `model` this is (0-based)."""
    status: str | None
    reward: float | None
    """The primary reward (see `primary_reward`), None when the verifier gave none."""
    rewards: dict[str, float] | None
    error: str | None = None


class ModelSummary(BaseModel):
    """The branches of one model: the value estimate of the checkpoint state under it."""

    model: str
    branches: int
    scored: int
    """Branches that produced a reward (the others ended in error before the verifier)."""
    mean_reward: float | None
    """Mean primary reward over the scored branches; None when none was scored."""


class BranchSummary(BaseModel):
    """summary.json in the parent folder."""

    parent: str
    """The parent folder (the shared prefix)."""
    original: str
    """The run branched from."""
    cut_index: int
    at: str | None
    children: list[ChildSummary]
    models: list[ModelSummary]


def primary_reward(rewards: dict[str, float] | None) -> float | None:
    """The ``reward`` entry of a rewards object, else its only entry, else None."""
    if not rewards:
        return None
    if "reward" in rewards:
        return rewards["reward"]
    return next(iter(rewards.values())) if len(rewards) == 1 else None


async def branch(
    run_folder: Path,
    *,
    at: At,
    models: Sequence[str],
    n: int = 1,
    concurrency: int = 4,
    tasks_dir: Path | None = None,
    timeout_seconds: float | None = None,
    output: Path | None = None,
    divergence_policy: DivergencePolicy = "warn",
    sandbox: str | None = None,
    console: Console | None = None,
) -> BranchSummary:
    """Run `n` continuations per model from checkpoint `at` of `run_folder` (``reroll branch``).

    Args:
        run_folder: the recorded run.
        at: the checkpoint: a step index or a fraction (see `reroll.checkpoint`).
        models: live model specs, one group of `n` branches each (a model given twice counts once;
            a ``scripted:PATH`` is recorded with its absolute path).
        n: branches per model, >= 1.
        concurrency: most branches running at once, >= 1.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        timeout_seconds: wall-clock budget of each branch [default: the original's].
        output: where the parent folder goes [default: ``<original's parent>/branched``].
        divergence_policy: the proxy's policy while replaying the prefix.
        sandbox: sandbox backend [default: the original's].
        console: where progress goes [default: nowhere]; each branch's own progress goes to
            ``harness/controller.log`` in its folder.

    Returns:
        The summary (also written to summary.json in the parent folder).

    Raises:
        ValueError: `models` is empty, or `n` or `concurrency` is below 1.
        RunFolderError: the folder is missing or corrupt, or `at` is malformed or out of range.
        TaskError, ModelError: the task or a model cannot be resolved.
        AgentError: the recorded agent is unknown or calls no model.
        Nothing is written when any of these is raised.
    """
    if not models or n < 1 or concurrency < 1:
        raise ValueError(f"branch needs models (got {list(models)}), n >= 1 (got {n}), concurrency >= 1")
    console = console or Console(quiet=True)
    checkpoint = open_checkpoint(run_folder, tasks_dir=tasks_dir, at=at, console=console)
    if checkpoint.agent.api_format == "none":
        raise AgentError(
            f"{checkpoint.original.path}: agent {checkpoint.agent.name!r} calls no model; nothing to branch"
        )
    parsed = (parse_model(spec, checkpoint.task.path) for spec in models)
    live_models = list({model.spec: model for model in parsed}.values())  # each model once
    original = checkpoint.original
    parent = _write_parent(checkpoint, output or original.path.parent / "branched", str(at))
    console.print(
        f"branching {original.path} at step {checkpoint.cut_index} (--at {at}): "
        f"{len(live_models)} model(s) x {n}, {concurrency} at a time"
    )
    console.print(f"parent folder: {parent}")
    shared = _Shared(
        checkpoint,
        parent,
        str(at),
        timeout_seconds,
        sandbox,
        divergence_policy,
        asyncio.Semaphore(concurrency),
        console,
    )
    async with asyncio.TaskGroup() as group:
        tasks = [
            group.create_task(_run_child(shared, live_model, index))
            for live_model in live_models
            for index in range(n)
        ]
    children = [task.result() for task in tasks]
    summary = BranchSummary(
        parent=str(parent),
        original=str(original.path),
        cut_index=checkpoint.cut_index,
        at=str(at),
        children=children,
        models=[_model_summary(model.spec, children) for model in live_models],
    )
    write_json(parent / SUMMARY, summary)
    return summary


def _write_parent(checkpoint: Checkpoint, output: Path, at: str) -> Path:
    """Create the parent folder: the original's config with provenance, prompts, the prefix."""
    original = checkpoint.original
    parent = create_run_folder(output, original.path.name).resolve()
    provenance = BranchedFrom(
        path=str(original.path),
        status=checkpoint.status,
        cut_index=checkpoint.cut_index,
        at=at,
        original_model=original.config.model,
        live_model=None,
    )
    config = original.config.model_copy(
        update={"started_at": now_iso(), "continued_from": None, "branched_from": provenance}
    )
    write_json(parent / "config.json", config)
    write_json(parent / "prompts.json", original.prompts)
    prefix = original.exchanges[: checkpoint.cut_index]
    (parent / TRAJECTORY).write_bytes(b"".join(exchange.to_line() for exchange in prefix))
    return parent


@dataclass(frozen=True)
class _Shared:
    """What every branch of one `branch` call shares."""

    checkpoint: Checkpoint
    parent: Path
    at: str
    timeout_seconds: float | None
    sandbox: str | None
    divergence_policy: DivergencePolicy
    limit: asyncio.Semaphore
    console: Console


async def _run_child(shared: _Shared, live_model: ModelSpec, index: int) -> ChildSummary:
    checkpoint = shared.checkpoint
    run_dir = create_run_folder(shared.parent, f"{_slug(live_model.spec)}__{index}")
    provenance = BranchedFrom(
        path=str(shared.parent),
        status=checkpoint.status,
        cut_index=checkpoint.cut_index,
        at=shared.at,
        original_model=checkpoint.original.config.model,
        live_model=live_model.spec,
        branch_index=index,
    )
    plan = continuation_plan(
        checkpoint,
        run_dir=run_dir,
        live_model=live_model,
        timeout_seconds=shared.timeout_seconds,
        sandbox=shared.sandbox,
        divergence_policy=shared.divergence_policy,
        provenance={"branched_from": provenance},
        replay_from=shared.parent / TRAJECTORY,
    )
    log_file = run_dir / "harness" / "controller.log"
    log_file.parent.mkdir(exist_ok=True)
    async with shared.limit:
        shared.console.print(f"[dim]started[/dim] {run_dir.name}")
        with open(log_file, "w") as log:
            result = await execute_rollout(plan, Console(file=log, highlight=False, soft_wrap=True))
    child = _child_summary(run_dir.name, live_model.spec, index, result)
    shared.console.print(f"[dim]finished[/dim] {run_dir.name}: {child.status}, reward {child.reward}")
    return child


def _child_summary(folder: str, model: str, index: int, result: RunResult) -> ChildSummary:
    return ChildSummary(
        folder=folder,
        model=model,
        branch_index=index,
        status=result.status,
        reward=primary_reward(result.rewards),
        rewards=result.rewards,
        error=result.error,
    )


def _model_summary(model: str, children: list[ChildSummary]) -> ModelSummary:
    mine = [child for child in children if child.model == model]
    rewards = [child.reward for child in mine if child.reward is not None]
    return ModelSummary(
        model=model,
        branches=len(mine),
        scored=len(rewards),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
    )


def _slug(spec: str) -> str:
    """A folder-name-safe short form of a model spec (``scripted:/x/fast.yaml`` → ``fast``)."""
    name = Path(spec.partition(":")[2]).stem if spec.startswith("scripted:") else spec
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"
