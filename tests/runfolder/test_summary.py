"""Summaries of graded rewards (`reroll.runfolder.summary`): a rollout's items and aggregate beside
its rewards, and the mean of each item over a branch tree's children."""

from __future__ import annotations

from pathlib import Path

from reroll.jobs.branch_points import BranchPoint
from reroll.jobs.branch_values import point_summary
from reroll.runfolder.summary import ChildSummary, item_means, summarise_rollout

from tests.export.conftest import WEIGHTED, WEIGHTED_RESULT, chat_exchanges, write_run


def test_a_rollout_summary_carries_the_items_and_aggregate_beside_rewards(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges(), result=WEIGHTED_RESULT)
    summary = summarise_rollout(run, task="t", agent="oracle", model=None, attempts=1)
    assert summary.rewards is not None and summary.rewards["reward"] == 0.4
    assert summary.items == WEIGHTED["items"]
    assert summary.aggregate is not None
    assert (summary.aggregate.method, summary.aggregate.weights) == (
        "weighted_mean",
        WEIGHTED["aggregate"]["weights"],
    )
    dumped = summary.model_dump(mode="json")
    assert dumped["aggregate"]["value"] == 0.4 and dumped["rewards"]["reward"] == 0.4


def test_a_flat_reward_has_no_items_or_aggregate(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges(), result={"rewards": {"reward": 1.0}})
    summary = summarise_rollout(run, task="t", agent="oracle", model=None, attempts=1)
    assert (summary.items, summary.aggregate) == (None, None)


def test_item_means_average_each_item_over_the_runs_that_have_it() -> None:
    assert item_means([{"a": 1.0, "b": 0.0}, None, {"a": 0.0, "b": 1.0}, {"a": 0.5}]) == {"a": 0.5, "b": 0.5}


def test_a_branch_point_and_its_models_summarise_each_item() -> None:
    def child(model: str, index: int, items: dict[str, float] | None, reward: float) -> ChildSummary:
        return ChildSummary(
            folder=f"{model}__{index}", model=model, branch_index=index, status="ok", reward=reward,
            rewards={"reward": reward, **(items or {})}, items=items,
        )  # fmt: skip

    children = [
        child("m1", 0, {"tests": 1.0, "docs": 1.0}, 1.0),
        child("m1", 1, {"tests": 0.0, "docs": 1.0}, 0.25),
        child("m2", 0, None, 0.0),
    ]
    point = point_summary(BranchPoint("3"), 3, children, ["m1", "m2"])
    assert point.item_means == {"tests": 0.5, "docs": 1.0}
    assert [(m.model, m.item_means) for m in point.models] == [
        ("m1", {"tests": 0.5, "docs": 1.0}),
        ("m2", {}),
    ]
