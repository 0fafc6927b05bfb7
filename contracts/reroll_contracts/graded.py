"""Graded rewards in BenchFlow's structured form: items (``metrics``) and an ``aggregate`` that
makes them one reward. Pure Python (no pydantic): the sidecar, which ships without it, reads
``reward.json`` with it, and the controller records the same `Aggregate` in result.json.

A ``reward.json`` in that form (BenchFlow 0.7.11's ``benchflow.rewards.validation``)::

    {"metrics": {"tests": 1.0, "lint": 0.0, "docs": 1.0, "style": 0.0},
     "aggregate": {"method": "weighted_mean",
                   "weights": {"tests": 0.3, "lint": 0.3, "docs": 0.1, "style": 0.3}}}

scores 0.4. Without ``metrics`` the top-level numbers (all but ``reward``) are the items. The
methods (a ``-`` in a name reads as ``_``):

- ``mean``: the items' mean;
- ``weighted_mean``: the weighted mean (no weights: every weight is 1.0);
- ``weighted_sum``: the weighted sum (weights required);
- ``threshold``: 1.0 when the weighted mean is at least ``threshold`` (default 0.7), else 0.0;
- ``all_pass`` / ``any_pass``: 1.0 when every / some item passes (is at least 0.5), else 0.0.

Weights, when given, cover exactly the items (each finite and not negative, their sum above 0 for
the means). The task's ``verifier/verifier.md`` may declare ``outputs.aggregate_policy`` (the
same keys, plus ``criteria``: the item names, which must be exactly the file's); each of its keys
overrides the file's. A file that already has a ``reward`` keeps it (nothing is computed, as in
BenchFlow); with ``reward.txt`` written too, its number must agree with the reward within 1e-9.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

AggregateMethod = Literal["mean", "weighted_mean", "weighted_sum", "threshold", "all_pass", "any_pass"]
METHODS: tuple[str, ...] = get_args(AggregateMethod)
PASS_MARK = 0.5
"""An item passes (``all_pass``, ``any_pass``) when its score is at least this."""
DEFAULT_THRESHOLD = 0.7
"""``threshold``'s bar when neither the policy nor the file sets one."""
AGREEMENT = 1e-9
"""How far reward.txt's number may be from reward.json's reward (absolute)."""
PASSTHROUGH_KEYS = frozenset(
    {"artifacts", "debug", "details", "details_path", "errors", "evidence", "metadata", "participants"}
    | {"raw", "reason", "reasons", "regressions", "winner", "rubric", "space", "granularity"}
)
"""Top-level keys BenchFlow keeps beside the numbers without scoring them (never items)."""


@dataclass(frozen=True)
class AggregatePolicy:
    """How items make one reward: a file's ``aggregate``, or verifier.md's ``aggregate_policy``.

    Each field None: not declared (the other declaration's, or the default, applies).
    """

    method: str | None = None
    """One of `METHODS` (``-`` reads as ``_``)."""
    weights: dict[str, float] | None = None
    """Item name → weight (finite, not negative)."""
    threshold: float | None = None
    """``threshold``'s bar, in [0, 1]."""
    criteria: tuple[str, ...] | None = None
    """The item names the verifier must report, exactly."""

    @classmethod
    def parse(cls, raw: Any, where: str) -> AggregatePolicy:
        """A policy from its JSON/YAML form (``method``, ``weights``, ``threshold``, ``criteria``;
        ``field``/``primary``, when given, must be ``reward``; ``fallback`` is the method when
        ``method`` is missing). Other keys are ignored, as BenchFlow ignores them (its own
        scaffold writes ``metrics:`` there).

        Raises:
            ValueError: not a mapping, or a field of the wrong type (the message names `where` and
                the field).
        """
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where} must be a mapping (method, weights, threshold, criteria)")
        for key in ("field", "primary"):
            if raw.get(key) not in (None, "reward"):
                raise ValueError(
                    f"{where}.{key} must be 'reward' (the reward reroll scores), not {raw[key]!r}"
                )
        method = raw.get("method") or raw.get("fallback")
        if method is not None and (not isinstance(method, str) or method.replace("-", "_") not in METHODS):
            raise ValueError(f"{where}.method must be one of {', '.join(METHODS)}, not {method!r}")
        weights = raw.get("weights")
        if weights is not None:
            if not isinstance(weights, Mapping):
                raise ValueError(f"{where}.weights must be a mapping of item name to number")
            weights = {
                str(name): _weight(value, f"{where}.weights.{name}") for name, value in weights.items()
            }
        threshold = raw.get("threshold")
        if threshold is not None and (not _is_number(threshold) or not 0.0 <= float(threshold) <= 1.0):
            raise ValueError(f"{where}.threshold must be a number between 0.0 and 1.0, not {threshold!r}")
        criteria = raw.get("criteria")
        if criteria is not None and (
            not isinstance(criteria, list | tuple) or not all(isinstance(c, str) and c for c in criteria)
        ):
            raise ValueError(f"{where}.criteria must be a list of item names")
        return cls(
            method=method.replace("-", "_") if method else None,
            weights=weights,
            threshold=None if threshold is None else float(threshold),
            criteria=None if criteria is None else tuple(criteria),
        )

    def over(self, other: AggregatePolicy) -> AggregatePolicy:
        """This policy's declared fields, the others from `other` (verifier.md over the file)."""
        return AggregatePolicy(
            method=self.method or other.method,
            weights=self.weights if self.weights is not None else other.weights,
            threshold=self.threshold if self.threshold is not None else other.threshold,
            criteria=self.criteria if self.criteria is not None else other.criteria,
        )


@dataclass(frozen=True)
class Aggregate:
    """How a graded reward was computed (result.json's ``verify_result.aggregate``)."""

    method: AggregateMethod
    value: float
    """The reward it gave (``rewards.reward``)."""
    weights: dict[str, float] = field(default_factory=dict)
    """The weights used, by item (all 1.0 for an unweighted ``weighted_mean``/``threshold``);
    empty for ``mean``, ``all_pass`` and ``any_pass``."""
    threshold: float | None = None
    """The bar ``threshold`` used; None for the other methods."""


@dataclass(frozen=True)
class GradedReward:
    """A ``reward.json`` in BenchFlow's structured form, read: its items and its reward."""

    reward: float
    items: dict[str, float]
    """Item name → score (``metrics``, or the file's top-level numbers)."""
    aggregate: Aggregate | None
    """How `reward` was computed; None when the file gave its own ``reward`` (or reward.txt did)."""


def is_graded(data: Mapping[str, Any], policy: AggregatePolicy | None) -> bool:
    """Whether a ``reward.json`` object is BenchFlow's structured form (it has ``metrics`` or
    ``aggregate``, or verifier.md declares a policy)."""
    return "metrics" in data or "aggregate" in data or policy is not None


def read_graded(
    data: Mapping[str, Any], policy: AggregatePolicy | None, text_reward: float | None
) -> GradedReward:
    """The graded reward of a ``reward.json`` object (see the module docstring).

    Args:
        data: the file's JSON object.
        policy: verifier.md's ``outputs.aggregate_policy``; None: none declared.
        text_reward: reward.txt's number when the verifier wrote that too; None: it did not.

    Raises:
        ValueError: an item or ``reward`` that is not a finite number, an invalid ``aggregate``,
            no reward and no method, weights that do not cover exactly the items, items that are
            not exactly the declared criteria, or reward.txt disagreeing (the message names
            reward.json, the field, and reward.txt where it is the cause).
    """
    items = _items(data)
    declared = (
        AggregatePolicy.parse(data["aggregate"], "reward.json's aggregate") if "aggregate" in data else None
    )
    if "reward" in data:
        reward = _number(data["reward"], "reward.json's reward")
        _agree(reward, text_reward, "reward")
        return GradedReward(reward=reward, items=items, aggregate=None)
    if declared is None and policy is None:
        if text_reward is not None:
            return GradedReward(reward=text_reward, items=items, aggregate=None)
        raise ValueError(
            "reward.json has no reward and no aggregate (and verifier.md declares no "
            "outputs.aggregate_policy): nothing says how its items make one reward"
        )
    effective = policy.over(declared or AggregatePolicy()) if policy else cast(AggregatePolicy, declared)
    aggregate = aggregate_items(items, effective)
    _agree(aggregate.value, text_reward, f"{aggregate.method} of its items")
    return GradedReward(reward=aggregate.value, items=items, aggregate=aggregate)


def aggregate_items(items: Mapping[str, float], policy: AggregatePolicy) -> Aggregate:
    """One reward from `items` by `policy` (see the module docstring for the methods).

    Raises:
        ValueError: no items, no method, items that are not exactly ``criteria``, weights missing
            for ``weighted_sum``, weights that do not cover exactly the items, or summing to 0.
    """
    if not items:
        raise ValueError("reward.json has no items to aggregate into a reward")
    if policy.method is None:
        raise ValueError("reward.json's aggregate (or verifier.md's aggregate_policy) names no method")
    method = cast(AggregateMethod, policy.method)
    if policy.criteria is not None and set(policy.criteria) != set(items):
        missing, extra = set(policy.criteria) - set(items), set(items) - set(policy.criteria)
        raise ValueError(
            "reward.json's items must be exactly the declared criteria"
            + (f"; missing: {', '.join(sorted(missing))}" if missing else "")
            + (f"; not declared: {', '.join(sorted(extra))}" if extra else "")
        )
    scores = list(items.values())
    if method == "mean":
        return Aggregate(method=method, value=sum(scores) / len(scores))
    if method in ("all_pass", "any_pass"):
        passes = [score >= PASS_MARK for score in scores]
        return Aggregate(method=method, value=1.0 if (all if method == "all_pass" else any)(passes) else 0.0)
    if method == "weighted_sum" and policy.weights is None:
        raise ValueError("reward.json's aggregate method weighted_sum needs weights")
    weights = _covering(items, policy.weights)
    total = sum(items[name] * weights[name] for name in items)
    if method == "weighted_sum":
        return Aggregate(method=method, value=total, weights=weights)
    if sum(weights.values()) <= 0:
        raise ValueError("reward.json's aggregate weights must sum above zero")
    mean = total / sum(weights.values())
    if method == "weighted_mean":
        return Aggregate(method=method, value=mean, weights=weights)
    bar = DEFAULT_THRESHOLD if policy.threshold is None else policy.threshold
    return Aggregate(method=method, value=1.0 if mean >= bar else 0.0, weights=weights, threshold=bar)


def _covering(items: Mapping[str, float], weights: Mapping[str, float] | None) -> dict[str, float]:
    """The weights by item (all 1.0 when none are given). Raises ValueError: not exactly the items."""
    if weights is None:
        return dict.fromkeys(items, 1.0)
    missing, extra = set(items) - set(weights), set(weights) - set(items)
    if missing or extra:
        raise ValueError(
            "reward.json's aggregate weights must cover exactly its items"
            + (f"; no weight for: {', '.join(sorted(missing))}" if missing else "")
            + (f"; weights for unknown items: {', '.join(sorted(extra))}" if extra else "")
        )
    return {name: weights[name] for name in items}


def _items(data: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` when present (only its items count), else the top-level numbers."""
    if "metrics" in data:
        metrics = data["metrics"]
        if not isinstance(metrics, Mapping):
            raise ValueError("reward.json's metrics must be an object of item name to number")
        return {str(name): _number(value, f"reward.json's metrics.{name}") for name, value in metrics.items()}
    return {
        str(name): _number(value, f"reward.json's {name}")
        for name, value in data.items()
        if name not in {"reward", "aggregate"} | PASSTHROUGH_KEYS
    }


def _agree(reward: float, text_reward: float | None, what: str) -> None:
    if text_reward is not None and not math.isclose(reward, text_reward, rel_tol=0.0, abs_tol=AGREEMENT):
        raise ValueError(
            f"reward.txt says {text_reward:g} but reward.json's {what} is {reward:g}: "
            "the verifier contradicts itself"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value))


def _number(value: Any, where: str) -> float:
    if not _is_number(value):
        raise ValueError(f"{where} is {value!r}, not a finite number")
    return float(value)


def _weight(value: Any, where: str) -> float:
    if not _is_number(value) or float(value) < 0:
        raise ValueError(f"{where} is {value!r}, not a finite number of at least 0")
    return float(value)
