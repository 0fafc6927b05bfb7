"""A graded reward (`reroll_contracts.graded`) on the Verify RPC, the controller's side: verifier.md's
aggregate policy into ``VerifyRequest.aggregate_policy``, ``VerifyResult.graded`` out of it. The
sidecar's side is `reroll_sidecar.rewards` (``policy_from_message``, ``graded_message``)."""

from __future__ import annotations

from typing import cast

from reroll_contracts.graded import Aggregate, AggregateMethod, AggregatePolicy, GradedReward
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb


def policy_message(policy: AggregatePolicy) -> pb.AggregatePolicy:
    """`policy` as ``VerifyRequest.aggregate_policy`` carries it (an undeclared field stays unset)."""
    message = pb.AggregatePolicy(method=policy.method or "", has_criteria=policy.criteria is not None)
    if policy.weights is not None:
        message.weights.values.update(policy.weights)
    if policy.threshold is not None:
        message.threshold = policy.threshold
    message.criteria.extend(policy.criteria or ())
    return message


def graded_reward(result: pb.VerifyResult) -> GradedReward:
    """The graded reward a Verify result carries (``graded``; its reward is ``rewards["reward"]``)."""
    aggregate = None
    if result.graded.HasField("aggregate"):
        wire = result.graded.aggregate
        aggregate = Aggregate(
            method=cast(AggregateMethod, wire.method),
            value=wire.value,
            weights=dict(wire.weights),
            threshold=wire.threshold if wire.HasField("threshold") else None,
        )
    return GradedReward(reward=result.rewards["reward"], items=dict(result.graded.items), aggregate=aggregate)
