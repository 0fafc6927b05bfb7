"""Reading the verifier's reward files (step 5 of `reroll_sidecar.verify`): ``reward.txt`` (one
number) and ``reward.json`` (an object of numbers, reroll's structured form, or BenchFlow's graded
form: metrics and an aggregate, `reroll_contracts.graded`). Every refusal is a result's
``reward_error`` naming the file, never an exception.
"""

from __future__ import annotations

import json
import math
import os

from reroll_contracts.graded import AGREEMENT, AggregatePolicy, GradedReward, is_graded, read_graded
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

__all__ = ["REWARD_FILES", "graded_message", "policy_from_message", "read_rewards"]

REWARD_FILES = ("reward.json", "reward.txt")
"""In the order they are read: reward.json wins where both are written (as in Harbor)."""
STRUCTURED_REWARD_KEYS = frozenset({"items", "events", "space", "granularity"})
"""The keys of reward.json's structured form (``reroll_contracts.reward.VerifyResult``), which the
controller validates; the sidecar reads the numbers beside them."""
MAX_REWARD_BYTES = 1024 * 1024


def read_rewards(reward_dir: str, policy: AggregatePolicy | None = None) -> pb.VerifyResult:
    """Read ``reward.json`` (first, as Harbor does) or ``reward.txt`` from `reward_dir` into a
    result's reward fields.

    reward.json is an object of numbers, or BenchFlow's structured form (``metrics`` and an
    ``aggregate``, or `policy`: verifier.md's ``outputs.aggregate_policy``), whose reward is
    computed from its items (`reroll_contracts.graded.read_graded`; the result's ``graded``). Where
    both files are written, reward.json's map wins: reward.txt's number must agree with its
    ``reward`` (or its aggregate) within 1e-9, else a reward error naming both, and is its
    ``reward`` when it has none. Every refusal is a ``reward_error``, never an exception.
    """
    text = _read_reward_file(reward_dir, "reward.txt")
    result = _read_reward_file(reward_dir, "reward.json", text, policy)
    if result is None:
        return text or pb.VerifyResult(
            reward_error=f"the verifier wrote neither {reward_dir}/reward.txt nor reward.json"
        )
    if text is None or result.reward_error or text.reward_error or result.HasField("graded"):
        return result
    if "reward" not in result.rewards:  # a map of items beside the text's scalar: both stand
        result.rewards["reward"] = text.rewards["reward"]
    elif not math.isclose(text.rewards["reward"], result.rewards["reward"], rel_tol=0.0, abs_tol=AGREEMENT):
        result.reward_error = (
            f"reward.txt says {text.rewards['reward']:g} but reward.json's reward is "
            f"{result.rewards['reward']:g}: the verifier contradicts itself"
        )
    return result


def _read_reward_file(
    reward_dir: str, name: str, text: pb.VerifyResult | None = None, policy: AggregatePolicy | None = None
) -> pb.VerifyResult | None:
    """One reward file's reward fields (or its error); None when it does not exist. `text` (the
    read reward.txt) and `policy` serve reward.json's structured form."""
    path = os.path.join(reward_dir, name)
    try:
        with open(path, "rb") as handle:
            content = handle.read(MAX_REWARD_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return pb.VerifyResult(reward_file=name, reward_error=f"cannot read {path}: {exc.strerror}")
    result = pb.VerifyResult(reward_file=name, reward_content=content[:MAX_REWARD_BYTES])
    if len(content) > MAX_REWARD_BYTES:
        result.reward_error = f"{name} is larger than {MAX_REWARD_BYTES} bytes"
        return result
    text_reward = text.rewards["reward"] if text is not None and not text.reward_error else None
    try:
        rewards = _parse_rewards(name, content.decode("utf-8", errors="replace"), policy, text_reward)
    except ValueError as exc:
        result.reward_error = str(exc)
        return result
    if isinstance(rewards, GradedReward):
        result.graded.CopyFrom(graded_message(rewards))
        rewards = {**rewards.items, "reward": rewards.reward}
    result.rewards.update(rewards)
    return result


def _parse_rewards(
    name: str, text: str, policy: AggregatePolicy | None = None, text_reward: float | None = None
) -> dict[str, float] | GradedReward:
    """``{"reward": x}`` from reward.txt's text, the object from reward.json's, or reward.json's
    structured form read (`read_graded`, with reward.txt's number `text_reward`). Raises ValueError."""
    if name == "reward.txt":
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"reward.txt holds {text.strip()[:80]!r}, not a number") from None
        rewards = {"reward": value}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"reward.json is not valid JSON: {exc}") from exc
        if isinstance(data, dict) and STRUCTURED_REWARD_KEYS.isdisjoint(data) and is_graded(data, policy):
            return read_graded(data, policy, text_reward)
        if isinstance(data, dict):  # the structured form's own keys: the controller reads them
            data = {key: value for key, value in data.items() if key not in STRUCTURED_REWARD_KEYS}
        if not isinstance(data, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
        ):
            raise ValueError('reward.json must be an object of numbers, e.g. {"reward": 1.0}')
        rewards = {str(key): float(value) for key, value in data.items()}
    for value in rewards.values():
        if not math.isfinite(value):
            raise ValueError(f"{name} holds {value}, not a finite number")
    return rewards


def policy_from_message(message: pb.AggregatePolicy) -> AggregatePolicy:
    """verifier.md's aggregate policy as `VerifyRequest.aggregate_policy` carries it."""
    return AggregatePolicy(
        method=message.method or None,
        weights=dict(message.weights.values) if message.HasField("weights") else None,
        threshold=message.threshold if message.HasField("threshold") else None,
        criteria=tuple(message.criteria) if message.has_criteria else None,
    )


def graded_message(graded: GradedReward) -> pb.GradedReward:
    """`GradedReward` as `VerifyResult.graded` carries it (the reward itself is ``rewards``)."""
    message = pb.GradedReward(items=graded.items)
    if (aggregate := graded.aggregate) is not None:
        message.aggregate.CopyFrom(
            pb.Aggregate(method=aggregate.method, value=aggregate.value, weights=aggregate.weights)
        )
        if aggregate.threshold is not None:
            message.aggregate.threshold = aggregate.threshold
    return message


def delete_old_rewards(reward_dir: str) -> str:
    """Delete the reward files a run may have left in `reward_dir`; why one could not be (e.g. an
    immutable file planted by the agent: a verifier error), or empty."""
    for name in REWARD_FILES:
        try:
            os.unlink(os.path.join(reward_dir, name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            return f"cannot delete the old {reward_dir}/{name}: {exc.strerror}; the test script was not run"
    return ""
