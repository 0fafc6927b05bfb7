"""What a branch's ``summary.json`` says of its children: each child's outcome (`child_summary`)
and the value estimate at each branch point, overall and per model (`point_summaries`)."""

from __future__ import annotations

from pathlib import Path

from reroll.jobs.branch_points import BranchPoint
from reroll.rollout.checkpoint import Checkpoint
from reroll.rollout.layers import LayeredCheckpoint
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.summary import (
    ChildSummary,
    ModelSummary,
    PointSummary,
    RolloutSummary,
    item_means,
    primary_reward,
)


def point_summaries(
    points: list[BranchPoint], checkpoints: list[Checkpoint], children: list[ChildSummary], specs: list[str]
) -> list[PointSummary]:
    """The value estimate at each point (`point_summary`), from the children branched there."""
    return [
        point_summary(point, opened.cut_index, [child for child in children if child.point == number], specs)
        for number, (point, opened) in enumerate(zip(points, checkpoints, strict=True))
    ]


def child_summary(summary: RolloutSummary, model: str, index: int, point: int, parent: Path) -> ChildSummary:
    """Child `summary` (the `index`-th of `model` at branch point `point`, its folder in `parent`),
    with the digests of the checkpoint layers it was restored from."""
    restored = RunPaths(parent / summary.name).restored_checkpoint
    digests = (
        LayeredCheckpoint.model_validate_json(restored.read_bytes()).digests if restored.is_file() else None
    )
    return ChildSummary(
        restored=digests,
        folder=summary.name,
        model=model,
        branch_index=index,
        status=summary.status,
        reward=primary_reward(summary.rewards),
        rewards=summary.rewards,
        error=summary.error,
        items=summary.items,
        aggregate=summary.aggregate,
        point=point,
    )


def point_summary(
    point: BranchPoint, cut_index: int, children: list[ChildSummary], models: list[str]
) -> PointSummary:
    """The value estimate at `point`: the mean reward of its `children`, overall and per model."""
    rewards = [child.reward for child in children if child.reward is not None]
    return PointSummary(
        at=point.at,
        cut_index=cut_index,
        prompt=point.prompt,
        answer=point.answer,
        branches=len(children),
        scored=len(rewards),
        mean_reward=_mean(rewards),
        item_means=item_means(child.items for child in children),
        models=[model_summary(model, children) for model in models],
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def model_summary(model: str, children: list[ChildSummary]) -> ModelSummary:
    """The mean reward of `model`'s children among `children`, overall and per graded item."""
    mine = [child for child in children if child.model == model]
    rewards = [child.reward for child in mine if child.reward is not None]
    return ModelSummary(
        model=model,
        branches=len(mine),
        scored=len(rewards),
        mean_reward=_mean(rewards),
        item_means=item_means(child.items for child in mine),
    )
