"""The two ``summary.json`` files: a job's (`JobSummary`, `JOB_SUMMARY_FILE`) and a branch tree's
(`BranchSummary`, `TREE_SUMMARY_FILE`). Same file name, two schemas: `reroll.runfolder.folders.kind_of`
tells the folders apart.

``<job>/summary.json`` lists every rollout of the job, with its status, rewards, attempts,
exchange and token counts, and the totals: status counts, the mean of each reward key, exchanges
and tokens. Tokens are the ``usage.total_tokens`` the upstream reported in the recorded responses
(0 when none was recorded, e.g. an agent that calls no model).

``<tree>/summary.json`` (`reroll.jobs.branch`'s parent folder) lists the branches (children) with
their rewards, the mean reward per model, and per branch point (a cut point of the run, and the
prompt or answer its children were given there) the mean reward: the value estimate V(s) of that
state; the points of ``--at 10,20,30`` are a value curve along the run (process reward).

A graded reward (result.json's ``verify_result``: items and, for BenchFlow's structured form, the
aggregate that made them one reward) is carried beside ``rewards`` as ``items`` and ``aggregate``;
a branch tree's models and points add the mean of each item (``item_means``), the value estimate
per criterion.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, Field
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import TrajectoryFormatError
from reroll_contracts.graded import Aggregate
from reroll_contracts.trajectory import load_trajectory

from reroll.runfolder.run import MAX_JSON_BYTES, RESULT_FILE, TRAJECTORY, RunResult, count_exchanges

JOB_SUMMARY_FILE = "summary.json"
"""In a job folder (or its ``continued/``): a `JobSummary`."""
TREE_SUMMARY_FILE = "summary.json"
"""In a branch tree's parent folder: a `BranchSummary`."""

Via = Literal["snapshot", "replay"]
"""How a branch's children reach its cut (`reroll.jobs.branch_layers.choose_via`): forked from a snapshot
of the prefix, or by replaying it."""


class RolloutSummary(BaseModel):
    """One rollout of a job, as it ended."""

    name: str
    """The run folder's name (under the job folder)."""
    task: str
    agent: str
    model: str | None = None
    status: str
    """``ok``, ``timeout``, ``error``, or ``unknown`` (no result.json, or ``status: null``: the
    rollout was interrupted before it ended)."""
    error_category: str | None = None
    error: str | None = None
    rewards: dict[str, float] | None = None
    items: dict[str, float] | None = None
    """The graded reward's items (result.json's ``verify_result.items``); None: not graded."""
    aggregate: Aggregate | None = None
    """How they made the reward (``verify_result.aggregate``: method, weights, threshold, value)."""
    attempts: int = 1
    """How many times it ran (retries after infrastructure failures included); 0 when it was
    skipped because an earlier run of the job had completed it."""
    retried_errors: list[str] = Field(default_factory=list)
    """The errors of the attempts that were retried, in order."""
    exchanges: int = 0
    """LLM exchanges the agent received."""
    tokens: int = 0
    """``usage.total_tokens`` summed over the recorded responses."""
    total_seconds: float | None = None
    """Wall-clock time of the last attempt, in seconds."""
    store_generation: int | None = None
    """A ``sequential-shared`` job: the learner store generation the rollout started from."""
    made_generation: int | None = None
    """A ``sequential-shared`` job: the generation the store as its agent left it became; None
    when it made none (it failed before the store was read)."""


class JobTotals(BaseModel):
    """Totals over a job's rollouts."""

    rollouts: int
    status_counts: dict[str, int]
    reward_means: dict[str, float]
    """Mean of each reward key over the rollouts that reported it."""
    retries: int
    """Attempts beyond the first, over all rollouts."""
    exchanges: int
    tokens: int


class StoreDiff(BaseModel):
    """What changed between two generations' files of a learner store (`reroll.runfolder.store`),
    each list sorted."""

    added: list[str] = Field(default_factory=list)
    modified: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """One line: ``+skills/a/SKILL.md ~memory/notes.md -old`` (``no change`` when empty)."""
        marks = [
            *(f"+{p}" for p in self.added),
            *(f"~{p}" for p in self.modified),
            *(f"-{p}" for p in self.removed),
        ]
        return " ".join(marks) or "no change"


class GenerationSummary(BaseModel):
    """One generation of a ``sequential-shared`` job's learner store (`reroll.runfolder.store`)."""

    generation: int
    parent: int | None
    rollout: str | None
    """The rollout that made it; None for generation 0."""
    status: str | None
    reward: float | None
    """Its rollout's primary reward (`primary_reward`)."""
    files: int
    """How many files it holds."""
    changes: StoreDiff
    """What changed since its parent (generation 0: all its files are added)."""
    head: bool = False
    """Whether the job's next rollout starts from it."""


class JobSummary(BaseModel):
    """``summary.json`` of a job folder (`JOB_SUMMARY_FILE`)."""

    job: str
    path: str
    started_at: str
    finished_at: str
    wall_seconds: float
    rollouts: list[RolloutSummary] = Field(default_factory=list)
    totals: JobTotals
    schedule: str = "parallel-independent"
    """``parallel-independent`` or ``sequential-shared`` (`reroll.jobs.jobfile.JobSpec.schedule`)."""
    store: list[GenerationSummary] | None = None
    """A ``sequential-shared`` job: its learner store's generations, by number."""


def read_result(run_dir: Path) -> RunResult | None:
    """The run's result.json, or None when it is missing or unreadable (a run cut short; a
    symlink, a FIFO or a file past `MAX_JSON_BYTES`, none of them read)."""
    try:
        return RunResult.model_validate(orjson.loads(read_data_file(run_dir / RESULT_FILE, MAX_JSON_BYTES)))
    except (OSError, ValueError):  # ValueError: invalid JSON or model, DataFileError
        return None


def is_complete(run_dir: Path) -> bool:
    """Whether the run finished: its result.json has a status and ``finished_at``."""
    result = read_result(run_dir)
    return result is not None and result.status is not None and result.finished_at is not None


def summarise_rollout(
    run_dir: Path,
    *,
    task: str,
    agent: str,
    model: str | None,
    attempts: int,
    retried_errors: list[str] | None = None,
) -> RolloutSummary:
    """Read what the rollout in `run_dir` left: result.json, with its counts (the trajectory's
    counts for a result.json of an earlier version, which has no tokens, or none)."""
    result = read_result(run_dir)
    if result is not None and result.counts.tokens is not None:
        exchanges, tokens = result.counts.exchanges, result.counts.tokens
    else:
        exchanges, tokens = _trajectory_counts(run_dir / TRAJECTORY)
    if result is None:
        return RolloutSummary(
            name=run_dir.name,
            task=task,
            agent=agent,
            model=model,
            status="unknown",
            attempts=attempts,
            exchanges=exchanges,
            tokens=tokens,
            error="no result.json",
        )
    return RolloutSummary(
        name=run_dir.name,
        task=task,
        agent=agent,
        model=model,
        status=result.effective_status,
        error_category=result.error_category,
        error=result.error,
        rewards=result.rewards,
        items=graded.items if (graded := result.verify_result) is not None and graded.items else None,
        aggregate=graded.aggregate if graded is not None else None,
        attempts=attempts,
        retried_errors=retried_errors or [],
        exchanges=exchanges,
        tokens=tokens,
        total_seconds=result.timings.total_seconds,
    )


def _trajectory_counts(path: Path) -> tuple[int, int]:
    """(exchanges, tokens) of a trajectory file; (0, 0) when there is none."""
    try:
        counts = count_exchanges(load_trajectory(path))
    except (FileNotFoundError, TrajectoryFormatError):
        return 0, 0
    return counts.exchanges, counts.tokens or 0


def totals(rollouts: list[RolloutSummary]) -> JobTotals:
    """Status counts, reward means, retries, exchanges and tokens over `rollouts`."""
    rewards: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        for key, value in (rollout.rewards or {}).items():
            rewards[key].append(value)
    return JobTotals(
        rollouts=len(rollouts),
        status_counts=dict(Counter(rollout.status for rollout in rollouts)),
        reward_means={key: round(sum(values) / len(values), 6) for key, values in sorted(rewards.items())},
        retries=sum(max(0, rollout.attempts - 1) for rollout in rollouts),
        exchanges=sum(rollout.exchanges for rollout in rollouts),
        tokens=sum(rollout.tokens for rollout in rollouts),
    )


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
    items: dict[str, float] | None = None
    """The graded reward's items (`RolloutSummary.items`); None: not graded."""
    aggregate: Aggregate | None = None
    """How they made the reward (`RolloutSummary.aggregate`)."""
    point: int = 0
    """The branch point (`BranchSummary.points`) the child continues from."""
    restored: dict[str, str] | None = None
    """A child forked by snapshot: the content digest of each layer it restored (environment,
    sandbox, session), equal to the tree's `BranchSummary.layers` (the restore checks it); None
    for a child that replayed the prefix."""


class ModelSummary(BaseModel):
    """The branches of one model: the value estimate of the checkpoint state under it."""

    model: str
    branches: int
    scored: int
    """Branches that produced a reward (the others ended in error before the verifier)."""
    mean_reward: float | None
    """Mean primary reward over the scored branches; None when none was scored."""
    item_means: dict[str, float] = Field(default_factory=dict)
    """Mean of each graded item over the branches that reported it (`item_means`)."""


class PointSummary(BaseModel):
    """One branch point: a checkpoint of the run and what its children were given there; the
    mean reward of its children estimates the value of that state."""

    at: str
    """The checkpoint as given (``--at``: a step, a fraction, ``TURN:STEP``)."""
    cut_index: int
    """How many recorded exchanges its children replay."""
    prompt: str | None = None
    """The prompt its children were given for the turn the cut starts (``--prompt``)."""
    answer: str | None = None
    """The answer its children were given to the recorded ask_user question (``--at-ask``)."""
    branches: int
    scored: int
    mean_reward: float | None
    """Mean primary reward over its scored children, all models; None when none was scored."""
    item_means: dict[str, float] = Field(default_factory=dict)
    """Mean of each graded item over its children that reported it, all models."""
    models: list[ModelSummary]


class BranchSummary(BaseModel):
    """``summary.json`` in a branch tree's parent folder (`TREE_SUMMARY_FILE`)."""

    parent: str
    """The parent folder (the shared prefix)."""
    original: str
    """The run branched from."""
    cut_index: int
    """How many recorded exchanges the parent folder holds: the latest cut point's."""
    at: str | None
    """The checkpoints as given (``--at``, comma-separated for several)."""
    children: list[ChildSummary]
    models: list[ModelSummary]
    """Mean reward per model over all its children (all points)."""
    points: list[PointSummary] = Field(default_factory=list)
    """The branch points in order (empty in a summary written before they existed: one point);
    several cut points make the value curve along the run."""

    @property
    def branch_points(self) -> list[PointSummary]:
        """`points`; for a summary written before they existed, its one point."""
        if self.points:
            return self.points
        scored = [child.reward for child in self.children if child.reward is not None]
        return [
            PointSummary(
                at=self.at or str(self.cut_index),
                cut_index=self.cut_index,
                branches=len(self.children),
                scored=len(scored),
                mean_reward=sum(scored) / len(scored) if scored else None,
                models=self.models,
            )
        ]

    def value_estimate(self, child: ChildSummary) -> float | None:
        """The mean reward of `child`'s model at its branch point: the value estimate of the state
        it continued from."""
        models = self.branch_points[child.point].models
        return next((model.mean_reward for model in models if model.model == child.model), None)

    via: Via = "replay"
    """How the children reached step K: forked from checkpoint layers (``snapshot``) or by
    re-executing the prefix each (``replay``)."""
    note: str | None = None
    """Why the tree replays although a snapshot was possible or asked (the agent has no resumable
    session), or where its checkpoint came from."""
    layers: dict[str, str] | None = None
    """``via = "snapshot"``: the checkpoint's content digest per layer (environment, sandbox, session)."""
    checkpoint: str | None = None
    """``via = "snapshot"``: the checkpoint folder the children were forked from."""
    snapshot_step: int | None = None
    """``via = "snapshot"``: the step of that checkpoint: the cut, or the nearest earlier step kept
    (each child started there and replayed the recorded exchanges up to the cut)."""


def item_means(items: Iterable[dict[str, float] | None]) -> dict[str, float]:
    """The mean of each item name over the maps that have it (rounded to 6 places), by name;
    None entries (runs without a graded reward) are skipped."""
    scores: dict[str, list[float]] = defaultdict(list)
    for found in items:
        for name, value in (found or {}).items():
            scores[name].append(value)
    return {name: round(sum(values) / len(values), 6) for name, values in scores.items()}


def primary_reward(rewards: dict[str, float] | None) -> float | None:
    """The ``reward`` entry of a rewards object, else its only entry, else None."""
    if not rewards:
        return None
    if "reward" in rewards:
        return rewards["reward"]
    return next(iter(rewards.values())) if len(rewards) == 1 else None


def read_tree_summary(path: Path) -> BranchSummary | None:
    """The branch tree's summary.json in `path`, or None when `path` is not a branch tree (no such
    file, or one that is not a `BranchSummary`: a job's summary.json, for one; a symlink, a FIFO
    or a file past `MAX_JSON_BYTES`, none of them read)."""
    try:
        data = read_data_file(path / TREE_SUMMARY_FILE, MAX_JSON_BYTES)
        return BranchSummary.model_validate(orjson.loads(data))
    except (OSError, ValueError):  # ValueError: invalid JSON or model, DataFileError
        return None
