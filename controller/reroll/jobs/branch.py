"""``reroll branch RUN --at K --model A [--model B …] [-n N]``: many continuations of one checkpoint.

Every branch replays the first K recorded exchanges — so its fresh sandbox reaches the state the
original run had at step K — then continues live with its model, and is verified: it is a
continuation (`reroll.rollout.start.start_rollout`) with ``branched_from`` provenance. The
branches run on the job runner (`reroll.jobs.runner.Runner`): each in its own sandbox, at most
``concurrency`` at a time and ``max_starting`` starting at once, on the asyncio or Ray executor,
with infrastructure failures retried (the failed attempt's folder goes to ``_attempts/`` in the
parent). The mean reward of a model's branches estimates the value of the checkpoint state
under that model.

The output is a tree::

    <output>/<run>/                     the parent: the shared prefix, itself a loadable run folder
      config.json                       the original's, with branched_from (path = the original run)
      prompts.json
      trajectory/llm_trajectory.jsonl   the first K recorded exchanges
      summary.json                      BranchSummary: per-child rewards, mean reward per model
      <model>__<i>/                     one run folder per branch, branched_from.path = the parent
                                        (<model>: `reroll.models.spec.model_slug`)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from reroll_contracts.errors import AgentError, ConfigError
from rich.console import Console

from reroll.jobs.executors import Attempt, RecordedTask
from reroll.jobs.jobfile import RunnerOptions
from reroll.jobs.runner import Runner, RunnerRollout
from reroll.models.spec import model_slug, parse_model
from reroll.rollout.checkpoint import At, Checkpoint, open_checkpoint, original_task_name
from reroll.rollout.start import FromCheckpoint, RolloutOptions, RolloutOutcome, start_rollout
from reroll.runfolder.folders import BRANCHED_DIR
from reroll.runfolder.run import (
    CONFIG_FILE,
    PROMPTS_FILE,
    TRAJECTORY,
    BranchedFrom,
    create_run_folder,
    now_iso,
    write_json,
)
from reroll.runfolder.summary import (
    TREE_SUMMARY_FILE,
    BranchSummary,
    ChildSummary,
    ModelSummary,
    RolloutSummary,
    primary_reward,
)
from reroll.sandbox.base import load_backend


async def branch(
    run_folder: Path,
    *,
    at: At,
    models: Sequence[str],
    n: int = 1,
    tasks_dir: Path | None = None,
    options: RolloutOptions = RolloutOptions(),
    runner: RunnerOptions = RunnerOptions(),
    output: Path | None = None,
    console: Console | None = None,
) -> BranchSummary:
    """Run `n` continuations per model from checkpoint `at` of `run_folder` (``reroll branch``).

    Args:
        run_folder: the recorded run.
        at: the checkpoint: a step index or a fraction (see `reroll.rollout.checkpoint`).
        models: live model specs, one group of `n` branches each (a model given twice counts once;
            a ``scripted:PATH`` is recorded with its absolute path).
        n: branches per model, >= 1.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        options: how each branch runs (timeout, sandbox, network [default: the original's],
            faults, the divergence policy while replaying the prefix).
        runner: how the branches run together: concurrency, start gate, executor, retries
            (`reroll.jobs.runner.Runner`).
        output: where the parent folder goes [default: ``<original's parent>/branched``].
        console: where the progress bar goes [default: nowhere]; each branch's own progress goes
            to ``harness/controller.log`` in its folder.

    Returns:
        The summary (also written to summary.json in the parent folder).

    Raises:
        ConfigError: `models` is empty, or `n` is below 1.
        JobError: the runner options are out of range, or the executor unknown or missing.
        SandboxBackendError: the sandbox backend is unknown, or its package is missing, or its
            settings are invalid.
        RunFolderError: the folder is missing or corrupt, or `at` is malformed or out of range.
        TaskError, ModelError: the task or a model cannot be resolved.
        AgentError: the recorded agent is unknown or calls no model.
        Nothing is written when any of these is raised.
    """
    if not models or n < 1:
        raise ConfigError(f"branch needs models (got {list(models)}) and n >= 1 (got {n})")
    batch = Runner(runner)
    console = console or Console(quiet=True)
    checkpoint = open_checkpoint(run_folder, at=at, tasks_dir=tasks_dir, console=console)
    if options.sandbox not in (None, checkpoint.original.config.sandbox):
        load_backend(options.sandbox).settings(options.sandbox_config)
    else:
        settings = {**checkpoint.original.config.sandbox_config, **(options.sandbox_config or {})}
        load_backend(checkpoint.original.config.sandbox).settings(settings)
    if checkpoint.agent.api_format == "none":
        raise AgentError(
            f"{checkpoint.original.path}: agent {checkpoint.agent.name!r} calls no model; nothing to branch"
        )
    parsed = (parse_model(spec, checkpoint.task.path, checkpoint.agent.name) for spec in models)
    specs = list({model.spec: None for model in parsed})  # each model once
    original = checkpoint.original
    parent = _write_parent(checkpoint, output or original.path.parent / BRANCHED_DIR)
    console.print(
        f"branching {original.path} at step {checkpoint.cut_index} (--at {at}): "
        f"{len(specs)} model(s) x {n}, {runner.concurrency} at a time"
    )
    console.print(f"parent folder: {parent}")
    branches = [(spec, index) for spec in specs for index in range(n)]
    rollouts = [
        RunnerRollout(
            Attempt(
                parent / f"{model_slug(spec)}__{index}",
                partial(
                    run_branch,
                    original.path,
                    at=str(at),
                    tasks_dir=tasks_dir.resolve() if tasks_dir else None,
                    parent=parent,
                    name=f"{model_slug(spec)}__{index}",
                    model=spec,
                    index=index,
                    options=options,
                ),
                reads=(original.path,),
                recorded_task=RecordedTask(original_task_name(original.config), checkpoint.task.path),
            ),
            checkpoint.task.name,
            checkpoint.agent.name,
            spec,
        )
        for spec, index in branches
    ]
    summaries = await batch.run(rollouts, console)
    children = [
        _child_summary(summary, spec, index)
        for summary, (spec, index) in zip(summaries, branches, strict=True)
    ]
    summary = BranchSummary(
        parent=str(parent),
        original=str(original.path),
        cut_index=checkpoint.cut_index,
        at=str(at),
        children=children,
        models=[_model_summary(spec, children) for spec in specs],
    )
    write_json(parent / TREE_SUMMARY_FILE, summary)
    return summary


async def run_branch(
    original: Path,
    *,
    at: str,
    tasks_dir: Path | None,
    parent: Path,
    name: str,
    model: str,
    index: int,
    options: RolloutOptions,
    start_gate: asyncio.Semaphore | None = None,
) -> RolloutOutcome:
    """Run branch `index` of `model`: continue checkpoint `at` of `original` with `model` into
    ``parent/name`` (an attempt of `branch`'s runner, a picklable call for Ray).

    Raises:
        RunFolderError, TaskError, ModelError: the original, its task or `model` cannot be
            loaded any more (found late; `branch` checked them before it started).
    """
    checkpoint = open_checkpoint(original, at=at, tasks_dir=tasks_dir)
    continued = checkpoint.continued_from(model)
    provenance = BranchedFrom(**(continued.model_dump() | {"path": str(parent), "branch_index": index}))
    return await start_rollout(
        FromCheckpoint(checkpoint, provenance),
        live_model=parse_model(model, checkpoint.task.path, checkpoint.agent.name),
        parent=parent,
        name=name,
        options=options,
        start_gate=start_gate,
    )


def _write_parent(checkpoint: Checkpoint, output: Path) -> Path:
    """Create the parent folder: the original's config with provenance, prompts, the prefix."""
    original = checkpoint.original
    parent = create_run_folder(output, original.path.name).resolve()
    provenance = BranchedFrom(**checkpoint.continued_from(None).model_dump())
    lineage = original.config.lineage_started_at or original.config.started_at
    config = original.config.model_copy(
        update={
            "started_at": now_iso(),
            "lineage_started_at": lineage,
            "continued_from": None,
            "branched_from": provenance,
        }
    )
    write_json(parent / CONFIG_FILE, config)
    write_json(parent / PROMPTS_FILE, original.prompts)
    prefix = original.exchanges[: checkpoint.cut_index]
    (parent / TRAJECTORY).write_bytes(b"".join(exchange.to_line() for exchange in prefix))
    return parent


def _child_summary(summary: RolloutSummary, model: str, index: int) -> ChildSummary:
    return ChildSummary(
        folder=summary.name,
        model=model,
        branch_index=index,
        status=summary.status,
        reward=primary_reward(summary.rewards),
        rewards=summary.rewards,
        error=summary.error,
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
