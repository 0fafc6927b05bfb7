"""BenchFlow's graded rewards (`reroll_contracts.graded`): each aggregate method and each refusal,
on the numbers BenchFlow 0.7.11 computes from the same reward.json."""

from __future__ import annotations

from typing import Any

import pytest
from reroll_contracts.graded import AggregatePolicy, aggregate_items, read_graded

ITEMS = {"tests": 1.0, "lint": 0.0, "docs": 1.0, "style": 0.0}
"""A partial agent: two of four items."""
WEIGHTS = {"tests": 0.3, "lint": 0.3, "docs": 0.1, "style": 0.3}


def graded(aggregate: dict[str, Any], metrics: dict[str, Any] | None = None) -> float:
    return read_graded({"metrics": metrics or ITEMS, "aggregate": aggregate}, None, None).reward


@pytest.mark.parametrize(
    ("aggregate", "expected"),
    [
        ({"method": "mean"}, 0.5),
        ({"method": "weighted_mean", "weights": WEIGHTS}, 0.4),
        ({"method": "weighted-mean"}, 0.5),  # no weights: all 1.0; "-" reads as "_"
        ({"method": "weighted_sum", "weights": WEIGHTS}, 0.4),
        ({"method": "weighted_sum", "weights": {"tests": 0.5, "lint": 1, "docs": 0.25, "style": 1}}, 0.75),
        ({"method": "threshold", "weights": WEIGHTS}, 0.0),  # 0.4 < 0.7 (the default bar)
        ({"method": "threshold", "weights": WEIGHTS, "threshold": 0.4}, 1.0),
        ({"method": "threshold"}, 0.0),  # 0.5 < 0.7
        ({"method": "all_pass"}, 0.0),
        ({"method": "any_pass"}, 1.0),
    ],
)
def test_each_method_scores_what_benchflow_computes(aggregate: dict[str, Any], expected: float) -> None:
    assert graded(aggregate) == pytest.approx(expected, abs=1e-12)


def test_pass_methods_count_half_as_a_pass_and_the_oracle_scores_one() -> None:
    assert graded({"method": "all_pass"}, {"a": 0.5, "b": 0.9}) == 1.0
    assert graded({"method": "any_pass"}, {"a": 0.49, "b": 0.0}) == 0.0
    assert graded({"method": "weighted_mean", "weights": WEIGHTS}, dict.fromkeys(ITEMS, 1.0)) == 1.0


def test_the_record_names_items_method_weights_and_value() -> None:
    result = read_graded({"metrics": ITEMS, "aggregate": {"method": "threshold"}}, None, None)
    assert result.items == ITEMS
    assert result.aggregate is not None
    assert (result.aggregate.method, result.aggregate.value, result.aggregate.threshold) == (
        "threshold",
        0.0,
        0.7,
    )
    assert result.aggregate.weights == dict.fromkeys(ITEMS, 1.0)


def test_top_level_numbers_are_the_items_without_metrics_and_only_metrics_count_with_it() -> None:
    flat = read_graded({**ITEMS, "aggregate": {"method": "mean"}, "reason": "two of four"}, None, None)
    assert (flat.items, flat.reward) == (ITEMS, 0.5)
    nested = read_graded({"metrics": {"a": 1.0}, "b": 0.0, "aggregate": {"method": "mean"}}, None, None)
    assert (nested.items, nested.reward) == ({"a": 1.0}, 1.0)


def test_an_existing_reward_is_kept_and_nothing_is_computed() -> None:
    result = read_graded({"reward": 0.9, "metrics": ITEMS, "aggregate": {"method": "mean"}}, None, None)
    assert (result.reward, result.items, result.aggregate) == (0.9, ITEMS, None)


def test_verifier_md_policy_overrides_the_file_key_by_key() -> None:
    policy = AggregatePolicy.parse({"method": "weighted_mean", "criteria": list(ITEMS)}, "verifier.md")
    result = read_graded(
        {"metrics": ITEMS, "aggregate": {"method": "mean", "weights": WEIGHTS}}, policy, None
    )
    assert result.aggregate is not None
    assert result.aggregate.method == "weighted_mean" and result.reward == pytest.approx(0.4)
    alone = read_graded({"metrics": ITEMS}, AggregatePolicy(method="any_pass"), None)
    assert alone.reward == 1.0


def test_reward_txt_that_agrees_within_1e_9_stands() -> None:
    result = read_graded({"metrics": ITEMS, "aggregate": {"method": "mean"}}, None, 0.5 + 1e-10)
    assert result.reward == 0.5


@pytest.mark.parametrize(
    ("data", "policy", "text", "message"),
    [
        (
            {"metrics": ITEMS, "aggregate": {"method": "weighted_mean", "weights": {"tests": 1.0}}},
            None,
            None,
            "weights must cover exactly its items; no weight for: docs, lint, style",
        ),
        (
            {"metrics": {"a": 1.0}, "aggregate": {"method": "weighted_sum", "weights": {"a": 1.0, "b": 2.0}}},
            None,
            None,
            "weights for unknown items: b",
        ),
        (
            {"metrics": ITEMS, "aggregate": {"method": "weighted_sum"}},
            None,
            None,
            "weighted_sum needs weights",
        ),
        (
            {"metrics": ITEMS, "aggregate": {"method": "mean"}},
            AggregatePolicy(criteria=("tests", "lint", "docs", "speed")),
            None,
            "exactly the declared criteria; missing: speed; not declared: style",
        ),
        (
            {"metrics": ITEMS, "aggregate": {"method": "mean"}},
            None,
            0.4,
            "reward.txt says 0.4 but reward.json's mean of its items is 0.5",
        ),
        ({"reward": 1.0, "metrics": ITEMS}, None, 0.0, "reward.txt says 0 but reward.json's reward is 1"),
        (
            {"metrics": {"tests": "passed"}, "aggregate": {"method": "mean"}},
            None,
            None,
            "reward.json's metrics.tests is 'passed', not a finite number",
        ),
        (
            {"tests": 1.0, "done": True, "aggregate": {"method": "mean"}},
            None,
            None,
            "reward.json's done is True",
        ),
        ({"metrics": ITEMS}, None, None, "no reward and no aggregate"),
        ({"metrics": ITEMS, "aggregate": {"method": "median"}}, None, None, "method must be one of mean"),
        ({"metrics": ITEMS, "aggregate": {"weights": WEIGHTS}}, None, None, "names no method"),
        ({"metrics": {}, "aggregate": {"method": "mean"}}, None, None, "no items to aggregate"),
        (
            {"metrics": ITEMS, "aggregate": {"method": "threshold", "threshold": 1.5}},
            None,
            None,
            "threshold must be a number between 0.0 and 1.0",
        ),
        (
            {"metrics": ITEMS, "aggregate": {"method": "mean", "primary": "score"}},
            None,
            None,
            "primary must be 'reward'",
        ),
        (
            {"metrics": {"a": 0.0}, "aggregate": {"method": "weighted_mean", "weights": {"a": 0}}},
            None,
            None,
            "weights must sum above zero",
        ),
    ],
)
def test_each_refusal_names_its_cause(
    data: dict[str, Any], policy: AggregatePolicy | None, text: float | None, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        read_graded(data, policy, text)
    assert message in str(caught.value)


def test_a_policy_ignores_unknown_keys_and_refuses_a_negative_weight() -> None:
    assert AggregatePolicy.parse({"method": "mean", "metrics": {"a": 1.0}}, "verifier.md") == AggregatePolicy(
        "mean"
    )
    with pytest.raises(ValueError, match=r"verifier\.md\.weights\.a is -1"):
        AggregatePolicy.parse({"method": "weighted_mean", "weights": {"a": -1}}, "verifier.md")
    with pytest.raises(ValueError, match="criteria must be a list"):
        AggregatePolicy.parse({"criteria": "a"}, "verifier.md")


def test_aggregate_items_keeps_the_item_order_of_the_weights_it_records() -> None:
    aggregate = aggregate_items(
        ITEMS, AggregatePolicy(method="weighted_mean", weights=dict(reversed(WEIGHTS.items())))
    )
    assert list(aggregate.weights) == list(ITEMS)
