"""The sidecar reads BenchFlow's graded reward.json (`reroll_sidecar.rewards`): the reward is
the aggregate of its items, carried to the controller as ``VerifyResult.graded``; every refusal
is a reward error naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_sidecar.rewards import policy_from_message, read_rewards

ITEMS = {"tests": 1.0, "lint": 0.0, "docs": 1.0, "style": 0.0}
WEIGHTS = {"tests": 0.3, "lint": 0.3, "docs": 0.1, "style": 0.3}


def write(folder: Path, data: object, text: str | None = None) -> None:
    (folder / "reward.json").write_text(json.dumps(data))
    if text is not None:
        (folder / "reward.txt").write_text(text)


def test_a_weighted_report_scores_its_aggregate_and_carries_its_structure(tmp_path: Path) -> None:
    write(tmp_path, {"metrics": ITEMS, "aggregate": {"method": "weighted_mean", "weights": WEIGHTS}})
    result = read_rewards(str(tmp_path))
    assert result.reward_error == ""
    assert dict(result.rewards) == pytest.approx({**ITEMS, "reward": 0.4})
    assert dict(result.graded.items) == ITEMS
    aggregate = result.graded.aggregate
    assert aggregate.method == "weighted_mean" and aggregate.value == pytest.approx(0.4)
    assert dict(aggregate.weights) == WEIGHTS
    assert not aggregate.HasField("threshold")


def test_verifier_md_policy_from_the_request_overrides_the_file(tmp_path: Path) -> None:
    write(tmp_path, {"metrics": ITEMS, "aggregate": {"method": "mean"}})
    message = pb.AggregatePolicy(method="threshold", threshold=0.5, criteria=list(ITEMS), has_criteria=True)
    message.weights.values.update(WEIGHTS)
    result = read_rewards(str(tmp_path), policy_from_message(message))
    assert (result.rewards["reward"], result.graded.aggregate.threshold) == (0.0, 0.5)  # 0.4 < 0.5
    message.criteria.append("speed")
    refused = read_rewards(str(tmp_path), policy_from_message(message))
    assert "exactly the declared criteria; missing: speed" in refused.reward_error
    assert dict(refused.rewards) == {}


def test_reward_txt_beside_a_graded_report_must_agree_within_1e_9(tmp_path: Path) -> None:
    write(tmp_path, {"metrics": ITEMS, "aggregate": {"method": "mean"}}, "0.5000000001\n")
    assert read_rewards(str(tmp_path)).rewards["reward"] == 0.5
    write(tmp_path, {"metrics": ITEMS, "aggregate": {"method": "mean"}}, "1\n")
    error = read_rewards(str(tmp_path)).reward_error
    assert error.startswith("reward.txt says 1 but reward.json's mean of its items is 0.5")


def test_items_beside_reward_txt_take_its_number_without_an_aggregate(tmp_path: Path) -> None:
    write(tmp_path, {"metrics": ITEMS}, "0.25\n")
    result = read_rewards(str(tmp_path))
    assert (result.rewards["reward"], dict(result.graded.items)) == (0.25, ITEMS)
    assert not result.graded.HasField("aggregate")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"metrics": ITEMS, "aggregate": {"method": "weighted_sum", "weights": {"tests": 1}}},
            "no weight for",
        ),
        ({"metrics": {**ITEMS, "docs": "yes"}, "aggregate": {"method": "mean"}}, "metrics.docs is 'yes'"),
        ({"metrics": ITEMS}, "no reward and no aggregate"),
    ],
)
def test_refusals_are_reward_errors(tmp_path: Path, data: object, message: str) -> None:
    write(tmp_path, data)
    result = read_rewards(str(tmp_path))
    assert message in result.reward_error
    assert (result.reward_file, dict(result.rewards), result.HasField("graded")) == ("reward.json", {}, False)


def test_flat_and_reroll_structured_files_are_read_as_before(tmp_path: Path) -> None:
    write(tmp_path, {"reward": 1.0, "style": 0.5})
    result = read_rewards(str(tmp_path))
    assert (dict(result.rewards), result.HasField("graded")) == ({"reward": 1.0, "style": 0.5}, False)
    write(tmp_path, {"reward": 0.5, "items": {"a": 0.5}})
    assert dict(read_rewards(str(tmp_path)).rewards) == {"reward": 0.5}
