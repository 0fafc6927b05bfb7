"""``reroll branch RUN --at K --model A [--model B …] [-n N]``: many continuations of checkpoints.

Every branch reaches the state the original run had at step K, then continues live with its
model, and is verified: it is a continuation (`reroll.rollout.start.start_rollout`) with
``branched_from`` provenance. It gets there ``via``

- ``replay``: each branch replays the first K recorded exchanges in its fresh sandbox (the
  agent re-executes the prefix, once per branch);
- ``snapshot``: the prefix is re-executed once (a replay-only rollout, ``_prefix/``, that stops
  at the cut) — or taken from a checkpoint recorded during the run
  (``<run>/checkpoints/step-K/``) — and its three layers captured there (environment state →
  workspace → agent session, `reroll.rollout.layers`); each branch restores them into its fresh
  sandbox and resumes the agent's native session, the proxy live from its first request.

The default is ``snapshot`` when the agent has a resumable session (`AgentSpec.forkable`: Claude
Code, Codex), else ``replay`` with a note in summary.json (mini-swe-agent, aider, OpenHands); an
agent declared `AgentSpec.process_checkpoint` (mini-swe-agent) forks by ``snapshot`` when asked,
on the isolated local sandbox: its process tree is a fourth layer (`reroll.rollout.process_layer`). The
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
      summary.json                      BranchSummary: per-child rewards, mean reward per model and
                                        per branch point, via, the layers' digests (snapshot)
      _prefix/                          snapshot: the replay-only rollout that rebuilt the prefix,
                                        its layers in checkpoints/step-K/ (`reroll.rollout.layers`)
      <model>__<i>/                     one run folder per branch, branched_from.path = the parent
                                        (<model>: `reroll.models.spec.model_slug`)
      <point>__<model>__<i>/            the same with several branch points (<point>: ``at<K>``,
                                        ``prompt<j>``, ``option<j>``, ``answer<j>``)

The parent's trajectory holds the first K exchanges of the latest cut point K (each child replays
its own cut's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from reroll_contracts.errors import AgentError, ConfigError
from rich.console import Console

from reroll.host.shared_process import prestart_proxy
from reroll.jobs.branch_layers import rebuilt_layers, recorded_layers, tree_via
from reroll.jobs.branch_points import BranchPoint, branch_points
from reroll.jobs.branch_values import child_summary, model_summary, point_summaries
from reroll.jobs.executors import Attempt, RecordedTask, attempt_reads
from reroll.jobs.jobfile import RunnerOptions
from reroll.jobs.runner import Runner, RunnerRollout, refuse_untravelled
from reroll.models.spec import model_slug, parse_model
from reroll.rollout.checkpoint import At, Checkpoint, open_checkpoint, original_task_name
from reroll.rollout.extensions.checkpoints import kept_pool
from reroll.rollout.layers import load_checkpoint
from reroll.rollout.process_layer import process_fork_refusal
from reroll.rollout.start import FromCheckpoint, RolloutOutcome, check_rollout, sandbox_of, start_rollout
from reroll.rollout.trust import refuse_untrusted
from reroll.runfolder.asks import AskLog
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import (
    BranchedFrom,
    RunFolder,
    create_run_folder,
    load_run_folder,
    now_iso,
    write_json,
)
from reroll.runfolder.summary import (
    BranchSummary,
    ChildSummary,
    RolloutSummary,
    Via,
)
from reroll.sandbox.ahead import StartsAhead, discard_ahead
from reroll.sandbox.base import create_sandbox, load_backend
from reroll.settings import DEFAULT_SANDBOX, RolloutSettings, with_recorded_inputs


async def branch(
    run_folder: Path,
    *,
    at: At | Sequence[At] | None = None,
    models: Sequence[str],
    n: int = 1,
    every: int | None = None,
    prompts: Sequence[str] = (),
    at_ask: int | None = None,
    answers: Sequence[str] = (),
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
    runner: RunnerOptions = RunnerOptions(),
    output: Path | None = None,
    console: Console | None = None,
    via: Via | None = None,
) -> BranchSummary:
    """Run `n` continuations per model from each branch point of `run_folder` (``reroll branch``).

    Args:
        run_folder: the recorded run.
        at: the checkpoint: a step index or a fraction (see `reroll.rollout.checkpoint`); several
            (a sequence, or text with commas) estimate the value at each (`branch_points`).
        models: live model specs, one group of `n` branches each (a model given twice counts once;
            a ``scripted:PATH`` is recorded with its absolute path).
        n: branches per model and branch point, >= 1.
        every: instead of `at`: a cut point every `every` exchanges, from 0 to the run's length.
        prompts: one branch point per prompt at `at`, the start of a turn: the prompt replaces
            the turn's recorded one.
        at_ask: instead of `at`: the run's ask_user question N; one branch point per option it
            offered, or per answer of `answers`, each cut where it was asked.
        answers: with `at_ask`: the answers to give instead of the options.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        options: how each branch runs (timeout, sandbox, network [default: the original's],
            faults, the divergence policy while replaying the prefix).
        runner: how the branches run together: concurrency, start gate, executor, retries
            (`reroll.jobs.runner.Runner`).
        output: where the parent folder goes [default: ``<original's parent>/branched``].
        console: where the progress bar goes [default: nowhere]; each branch's own progress goes
            to ``harness/controller.log`` in its folder.
        via: ``snapshot`` or ``replay`` (the module docstring) [default: snapshot where the agent
            has a resumable session, else replay]; an agent that cannot be forked replays either
            way, with a note in the summary (`reroll.jobs.branch_layers.choose_via`).

    Returns:
        The summary (also written to summary.json in the parent folder).

    Raises:
        ConfigError: `models` is empty, `n` is below 1, or the branch points are malformed
            (`branch_points`).
        JobError: the runner options are out of range, or the executor unknown or missing; or
            the executor runs rollouts on other machines and the run reads a host file that does
            not travel (`reroll.jobs.runner.refuse_untravelled`).
        SandboxBackendError: the sandbox backend is unknown, or its package is missing, or its
            settings are invalid.
        RunFolderError: the folder is missing or corrupt, a checkpoint is malformed or out of
            range, or a prompt is given at a cut that is not the start of a turn.
        TaskError, ModelError: the task or a model cannot be resolved.
        AgentError: the recorded agent is unknown or calls no model.
        Nothing is written when any of these is raised.
        EnvironmentStateError: ``snapshot``: the prefix could not be rebuilt and captured, or its
            checkpoint is inconsistent (the parent folder says how far it got).
    """
    if not models or n < 1:
        raise ConfigError(f"branch needs models (got {list(models)}) and n >= 1 (got {n})")
    points = branch_points(run_folder, at, every=every, prompts=prompts, at_ask=at_ask, answers=answers)
    batch = Runner(runner)
    console = console or Console(quiet=True)
    checkpoints, bound = _open_points(run_folder, points, tasks_dir, options, console)
    specs = _model_specs(max(checkpoints, key=lambda opened: opened.cut_index), models)
    plan = _TreePlan(points, checkpoints, specs, n, bound, _given(points, every, at_ask))
    plan.refuse_unrunnable()
    await _prestart(runner)  # refused by now if ever: nothing started for nothing
    plan.write_parent(output, runner, console)
    reached = await plan.reach_cut(at_ask, via, options, console)
    children = await plan.run_children(batch, tasks_dir, reached, runner, console)
    summary = plan.summary(children, reached)
    write_json(RunPaths(plan.parent).tree_summary, summary)
    return summary


async def _prestart(runner: RunnerOptions) -> None:
    """Where the children run in this process (the ``asyncio`` executor), start the shared LLM
    proxy (and scripted model) they will join now, while the parent is written and the layers
    found (its start, a second of imports, is most of a child's;
    `reroll.host.shared_process.prestart`)."""
    if runner.executor == "asyncio":
        await prestart_proxy()  # spawned before the (sync) parent is written


@dataclass(frozen=True)
class _Reached:
    """How a tree's branches reach their cut (`_TreePlan.reach_cut`)."""

    via: Via
    note: str | None
    """Why it is not a snapshot, or where the snapshot came from."""
    layers: Path | None = None
    """The checkpoint folder the children fork from (``snapshot``)."""
    digests: dict[str, str] | None = None
    """Its layers' digests (``snapshot``)."""
    pool: str | None = None
    """The kept copy-on-write snapshot of the cut the children start from (`kept_pool`), if any."""
    step: int | None = None
    """The step of `layers`: the cut, or an earlier step (the children replay the remainder)."""


@dataclass
class _TreePlan:
    """A branch tree ready to run: each point's checkpoint, the models, `n` branches per pair."""

    points: list[BranchPoint]
    checkpoints: list[Checkpoint]
    """Each point's checkpoint, in the order of `points`."""
    specs: list[str]
    n: int
    bound: RolloutSettings
    """How each branch runs, the recorded run's host inputs bound."""
    given: str
    """How the points were named (`_given`)."""
    parent: Path = Path()
    """The parent folder (`write_parent`)."""

    @property
    def backend(self) -> str:
        """The sandbox backend the branches run on (the command's, else the original's)."""
        return self.bound.sandbox or self.checkpoint.original.config.sandbox

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint of the latest cut (the prefix every snapshot branch is rebuilt to)."""
        return max(self.checkpoints, key=lambda opened: opened.cut_index)

    @property
    def planned(self) -> list[tuple[int, str, int]]:
        """Every branch as (point number, model spec, index within its group), in order."""
        return [
            (number, spec, index)
            for number in range(len(self.points))
            for spec in self.specs
            for index in range(self.n)
        ]

    def rollouts(self, tasks_dir: Path | None, reached: _Reached) -> list[RunnerRollout]:
        """Every branch's rollout (`_branch_rollout`), in the order of `planned`."""
        bound = self.bound
        return [
            _branch_rollout(
                self.checkpoint, self.points[number], spec, index, self.parent, tasks_dir, bound, reached
            )
            for number, spec, index in self.planned
        ]

    def refuse_unrunnable(self) -> None:
        """Refuse, before anything is written, what the first branch's rollout would refuse
        (`reroll.rollout.start.check_rollout`: the judge's and User's models, the MCP servers,
        skills …) — found there, every branch would end in error after the parent was written.

        Raises:
            RerollError: as `reroll.rollout.start.start_rollout`.
        """
        number, spec, index = self.planned[0]
        checkpoint, point = self.checkpoints[number], self.points[number]
        origin = _branch_origin(checkpoint, point, self.parent, index, spec, None, None)
        live = parse_model(spec, checkpoint.task.path, checkpoint.agent.name)
        check_rollout(origin, live_model=live, options=self.bound)

    def write_parent(self, output: Path | None, runner: RunnerOptions, console: Console) -> None:
        """Refuse an executor the run's host files cannot travel to, write the parent folder
        (`output`, default ``<original's parent>/branched``) and say what will run.

        Raises:
            JobError: as `reroll.jobs.runner.refuse_untravelled`.
        """
        original = self.checkpoint.original
        refuse_untravelled(original.config, original.path, runner.executor)
        self.parent = _write_parent(self.checkpoint, output or RunPaths(original.path).beside("branched"))
        cuts = [opened.cut_index for opened in self.checkpoints]
        console.print(
            f"branching {original.path} at step(s) {cuts} (--at {self.given}): "
            f"{len(self.points)} point(s) x {len(self.specs)} model(s) x {self.n}, "
            f"{runner.concurrency} at a time"
        )
        console.print(f"parent folder: {self.parent}")

    async def reach_cut(
        self, at_ask: int | None, via: Via | None, options: RolloutSettings, console: Console
    ) -> _Reached:
        """Choose how the branches reach the cut (`reroll.jobs.branch_layers.tree_via`); for a
        snapshot, rebuild the prefix and capture its checkpoint (`rebuilt_layers`).

        Raises:
            EnvironmentStateError: as `branch`.
        """
        sandbox = self.backend
        refusal = process_fork_refusal(sandbox)
        chosen, note = tree_via(self.checkpoint, self.points, at_ask, via, refusal)
        reached = _Reached(chosen, note)
        if chosen == "snapshot":
            process = not self.checkpoint.agent.forkable  # its memory: only a rebuilt prefix dumps it
            found = None if process else recorded_layers(self.checkpoint, sandbox, console)
            if found is None:
                layers, rebuilt = await rebuilt_layers(
                    self.checkpoint, self.parent, options, console, process=process
                )
                note = "; ".join(part for part in (note, rebuilt) if part)
                step, (pool, pool_note) = self.checkpoint.cut_index, kept_pool(layers, sandbox)
            else:
                layers, step, pool, pool_note = found
                note = f"layers recorded during the run, {layers}"
            digests = load_checkpoint(layers, step=step).digests
            note = "; ".join(part for part in (note, pool_note) if part)
            reached = _Reached(chosen, note, layers, digests, pool, step)
        console.print(f"branches reach their cut via {chosen}" + (f" ({note})" if note else ""))
        return reached

    async def run_children(
        self,
        batch: Runner,
        tasks_dir: Path | None,
        reached: _Reached,
        runner: RunnerOptions,
        console: Console,
    ) -> list[ChildSummary]:
        """Run the branches on the job runner `batch`, the first ones' sandboxes started ahead
        (`start_ahead`; those no child took are stopped whatever happened)."""
        rollouts = self.rollouts(tasks_dir, reached)
        self.start_ahead(reached, runner)
        try:
            return _children(await batch.run(rollouts, console), self.planned, self.parent)
        finally:
            await discard_ahead()  # those no child took (one ended before its start)

    def start_ahead(self, reached: _Reached, runner: RunnerOptions) -> None:
        """Start the sandboxes of the first branches the runner starts (``concurrency``, at most
        ``max_starting``) now, where they fork from a kept pool in this process and the backend
        can hand them over (`reroll.sandbox.ahead`: docker): their starts overlap the runner's and
        each child's own steps before its sandbox starts.

        Raises:
            As `reroll.rollout.start.check_rollout` (found before by `refuse_unrunnable`).
        """
        if reached.pool is None or runner.executor != "asyncio":
            return
        factory = load_backend(self.backend).factory
        if not (isinstance(factory, type) and issubclass(factory, StartsAhead)):
            return  # before `sandbox_of`, which runs the extensions' `configure` once more
        for number, spec, index in self.planned[: min(runner.concurrency, runner.max_starting)]:
            checkpoint, point = self.checkpoints[number], self.points[number]
            origin = _branch_origin(
                checkpoint, point, self.parent, index, spec, reached.layers, reached.pool, reached.step
            )
            live = parse_model(spec, checkpoint.task.path, checkpoint.agent.name)
            backend, sandbox_spec, settings = sandbox_of(origin, live_model=live, options=self.bound)
            sandbox = create_sandbox(backend, sandbox_spec, _folder(point, spec, index), settings)
            if not (isinstance(sandbox, StartsAhead) and sandbox.start_ahead()):
                return

    def summary(self, children: list[ChildSummary], reached: _Reached) -> BranchSummary:
        """The tree's summary: its children, each model's and each point's value estimate."""
        return BranchSummary(
            parent=str(self.parent),
            original=str(self.checkpoint.original.path),
            cut_index=self.checkpoint.cut_index,
            at=self.given,
            children=children,
            models=[model_summary(spec, children) for spec in self.specs],
            points=point_summaries(self.points, self.checkpoints, children, self.specs),
            via=reached.via,
            note=reached.note,
            layers=reached.digests,
            checkpoint=str(reached.layers) if reached.layers else None,
            snapshot_step=reached.step,
        )


def _children(
    summaries: list[RolloutSummary], planned: list[tuple[int, str, int]], parent: Path
) -> list[ChildSummary]:
    """The children's summaries, in the order they were `planned` as (point, model, index)."""
    return [
        child_summary(summary, spec, index, number, parent)
        for summary, (number, spec, index) in zip(summaries, planned, strict=True)
    ]


def _branch_rollout(
    checkpoint: Checkpoint,
    point: BranchPoint,
    spec: str,
    index: int,
    parent: Path,
    tasks_dir: Path | None,
    bound: RolloutSettings,
    reached: _Reached,
) -> RunnerRollout:
    """The job runner's rollout of child `index` of model `spec` at `point`: a `run_branch` attempt
    that declares what it reads (the recorded run, the layers, the settings' host paths)."""
    original = checkpoint.original
    name = _folder(point, spec, index)
    run = partial(
        run_branch,
        original.path,
        at=point.at,
        prompt=point.prompt,
        answer=point.answer,
        tasks_dir=tasks_dir.resolve() if tasks_dir else None,
        parent=parent,
        name=name,
        model=spec,
        index=index,
        options=bound,
        layers=reached.layers,
        pool=reached.pool,
        layers_step=reached.step,
    )
    layers = reached.layers
    shipped = [layers] if layers and not layers.is_relative_to(original.path) else []
    attempt = Attempt(
        parent / name,
        run,
        reads=attempt_reads(original.path, *shipped, options=bound, model=spec),
        recorded_task=RecordedTask(original_task_name(original.config), checkpoint.task.path),
    )
    return RunnerRollout(attempt, checkpoint.task.name, checkpoint.agent.name, spec)


def _open_points(
    run_folder: Path,
    points: list[BranchPoint],
    tasks_dir: Path | None,
    options: RolloutSettings,
    console: Console,
) -> tuple[list[Checkpoint], RolloutSettings]:
    """Each point's checkpoint, from `run_folder` read once, and `options` with the recorded
    run's host inputs bound (`reroll.settings.with_recorded_inputs`).

    Raises:
        RunFolderError, TaskError, AgentError: as `branch`.
        UntrustedCodeError: the run names host code `options` does not trust again.
        SandboxBackendError: the sandbox backend or its settings are invalid.
    """
    recorded = load_run_folder(run_folder)  # read once: each point's checkpoint opens from it
    refuse_untrusted(recorded.config, recorded.path, options.trust)  # before anything it names is imported
    checkpoints = [_open_point(recorded, point, tasks_dir, console) for point in points]
    bound = with_recorded_inputs(options, recorded.config)  # every host path it reads, bound
    load_backend(bound.sandbox or DEFAULT_SANDBOX).typed(bound.sandbox_config)
    return checkpoints, bound


def _model_specs(checkpoint: Checkpoint, models: Sequence[str]) -> list[str]:
    """The specs of `models`, each once, resolved for the checkpoint's task and agent.

    Raises:
        AgentError: the recorded agent calls no model.
        ModelError: a model cannot be resolved.
    """
    if checkpoint.agent.api_format == "none":
        raise AgentError(
            f"{checkpoint.original.path}: agent {checkpoint.agent.name!r} calls no model; nothing to branch"
        )
    parsed = (parse_model(spec, checkpoint.task.path, checkpoint.agent.name) for spec in models)
    return list({model.spec: None for model in parsed})


def _given(points: list[BranchPoint], every: int | None, at_ask: int | None) -> str:
    """How the points were named, for the summary's ``at`` (``10,20``, ``every 5``, ``ask 0 (step 3)``)."""
    given = ",".join(dict.fromkeys(point.at for point in points))
    if every is not None or at_ask is not None:
        given = f"every {every}" if every is not None else f"ask {at_ask} (step {given})"
    return given


def _open_point(
    run_folder: Path | RunFolder, point: BranchPoint, tasks_dir: Path | None, console: Console
) -> Checkpoint:
    """The checkpoint of `point`, with its prompt.

    Raises:
        RunFolderError, TaskError, AgentError: as `reroll.rollout.checkpoint.open_checkpoint`,
            and `Checkpoint.with_prompt`.
    """
    checkpoint = open_checkpoint(run_folder, at=point.at, tasks_dir=tasks_dir, console=console)
    return checkpoint.with_prompt(point.prompt) if point.prompt is not None else checkpoint


def _folder(point: BranchPoint, model: str, index: int) -> str:
    """A child's folder name: ``[<point>__]<model>__<i>``."""
    return f"{point.label}__" * bool(point.label) + f"{model_slug(model)}__{index}"


async def run_branch(
    original: Path,
    *,
    at: str,
    prompt: str | None = None,
    answer: str | None = None,
    tasks_dir: Path | None,
    parent: Path,
    name: str,
    model: str,
    index: int,
    options: RolloutSettings,
    layers: Path | None = None,
    start_gate: asyncio.Semaphore | None = None,
    pool: str | None = None,
    layers_step: int | None = None,
) -> RolloutOutcome:
    """Run branch `index` of `model`: continue checkpoint `at` of `original` with `model` into
    ``parent/name`` (an attempt of `branch`'s runner, a picklable call for Ray), with `prompt`
    for the turn the cut starts and `answer` for the ask_user question at the cut when given;
    with `layers` (a checkpoint folder of step K), forked from them instead of replaying the prefix,
    its sandbox started from `pool` (``<pool>:step-K``, `kept_pool`) when given; `layers_step`:
    the step of `layers` when earlier than the cut (the remainder replayed, then live).

    Raises:
        RunFolderError, TaskError, ModelError: the original, its task or `model` cannot be
            loaded any more (found late; `branch` checked them before it started).
    """
    point = BranchPoint(at, prompt, answer)
    checkpoint = _open_point(original, point, tasks_dir, Console(quiet=True))
    origin = _branch_origin(checkpoint, point, parent, index, model, layers, pool, layers_step)
    return await start_rollout(
        origin,
        live_model=parse_model(model, checkpoint.task.path, checkpoint.agent.name),
        parent=parent,
        name=name,
        options=options,
        start_gate=start_gate,
    )


def _branch_origin(
    checkpoint: Checkpoint,
    point: BranchPoint,
    parent: Path,
    index: int,
    model: str,
    layers: Path | None,
    pool: str | None,
    layers_step: int | None = None,
) -> FromCheckpoint:
    """Where branch `index` of `model` starts: `point`'s `checkpoint` (`_open_point`), with the
    ``branched_from`` provenance naming `parent` and what the point gives (its prompt, the answer
    at the cut), and how it reaches the cut (from `layers` of the cut or of the earlier
    `layers_step`, and `pool`, else by replay)."""
    update = {
        "path": str(parent),
        "branch_index": index,
        "prompt": point.prompt,
        "answer": point.answer,
        "via": "snapshot" if layers else "replay",
    }
    provenance = BranchedFrom(**(checkpoint.continued_from(model).model_dump() | update))
    fork = (pool, layers_step) if layers else (None, None)
    return FromCheckpoint(checkpoint, provenance, layers, *fork)


def _write_parent(checkpoint: Checkpoint, output: Path) -> Path:
    """Create the parent folder: the original's config with provenance, prompts, the prefix (and
    the questions asked in it)."""
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
    paths = RunPaths(parent)
    write_json(paths.config, config)
    write_json(paths.prompts, original.prompts)
    prefix = original.exchanges[: checkpoint.cut_index]
    paths.trajectory.write_bytes(b"".join(exchange.to_line() for exchange in prefix))
    if checkpoint.recorded_asks:
        write_json(paths.asks, AskLog(asks=checkpoint.recorded_asks))
    return parent
