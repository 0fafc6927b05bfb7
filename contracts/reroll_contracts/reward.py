"""Graded rewards: the structured result of a verifier (the seeds' ``VerifyResult``).

A verifier may score more than one number: a judge scores each rubric item, a script may tag
events with the step of the trajectory they refer to. `VerifyResult` is that result, the seeds'
``{reward, items, events, space, granularity}`` (BenchFlow's ``benchflow.rewards.protocol.VerifyResult``
and ``benchflow.rewards.events.RewardEvent``, without their wall-clock ``ts``: a re-scored run
must give the same file byte for byte). It crosses the sandbox boundary as ``reward.json``::

    {"reward": 0.75,
     "items": {"accuracy": 1.0, "clarity": 0.5},
     "events": [{"source": "criterion:accuracy", "reward": 1.0, "step": 3, "space": "action",
                 "granularity": "step", "note": "the agent ran the tests"}],
     "space": "output", "granularity": "terminal"}

A ``reward.json`` without ``items``, ``events``, ``space`` and ``granularity`` is the flat form
BenchFlow and Harbor write (an object of numbers) and gives no `VerifyResult`. result.json keeps
the flat ``rewards`` (`VerifyResult.flat`) and adds the structured form as ``verify_result``.

BenchFlow's graded form (``metrics`` and an ``aggregate``, `reroll_contracts.graded`) is recorded
the same way: its items as ``items``, and how the reward was computed from them as ``aggregate``
(method, weights, threshold, value; `VerifyResult.from_graded`).
"""

from __future__ import annotations

import math
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reroll_contracts.graded import Aggregate, GradedReward

Space = Literal["output", "action", "reasoning", "memory", "latent"]
"""Which space a signal reads (seeds' architecture, "Evaluation — the five spaces"): output (did
it finish the job?), action (right actions, did it ask?), reasoning (is the chain of thought
sound?), memory (did it update memory / skills correctly?); latent is named, never scored."""
Granularity = Literal["terminal", "step"]
"""``terminal``: the whole trajectory; ``step``: one edge (one exchange of the trajectory)."""
STRUCTURED_KEYS = ("items", "events", "space", "granularity")
"""The keys that make a ``reward.json`` the structured form."""


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number")
    return value


class RewardEvent(BaseModel):
    """One reward signal with its tag (space, granularity) and the step it refers to."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str = Field(min_length=1)
    """What produced it: ``criterion:<name>`` for a rubric item, or the script's own name."""
    reward: float
    """Its value (a judge's items are in [0, 1])."""
    step: int | None = Field(default=None, ge=0)
    """The exchange of ``trajectory/llm_trajectory.jsonl`` it refers to (``metadata.step``, from
    0); None: the whole trajectory."""
    space: Space = "output"
    granularity: Granularity = "terminal"
    note: str = ""
    """Why (a judge's reasoning), for people."""

    _check_reward = field_validator("reward")(_finite)


class VerifyResult(BaseModel):
    """A verifier's structured result (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    reward: float
    """The headline reward (``rewards.reward``)."""
    items: dict[str, float] = {}
    """Scores by item name (a rubric's criteria, normalised to [0, 1])."""
    events: list[RewardEvent] = []
    space: Space = "output"
    """The space the headline reward reads."""
    granularity: Granularity = "terminal"
    aggregate: Aggregate | None = Field(default=None, exclude_if=lambda value: value is None)
    """How `reward` was computed from `items` (BenchFlow's graded form: method, weights, threshold,
    value); None: the verifier gave the reward itself."""

    _check_reward = field_validator("reward")(_finite)

    @classmethod
    def from_graded(cls, graded: GradedReward) -> VerifyResult:
        """The record of a graded ``reward.json`` (`reroll_contracts.graded.read_graded`)."""
        return cls(reward=graded.reward, items=graded.items, aggregate=graded.aggregate)

    @field_validator("items")
    @classmethod
    def _check_items(cls, items: dict[str, float]) -> dict[str, float]:
        for name, value in items.items():
            if name == "reward":
                raise ValueError("an item may not be named 'reward' (the headline reward's name)")
            _finite(value)
        return items

    def flat(self) -> dict[str, float]:
        """result.json's ``rewards``: ``{"reward": reward, **items}`` (BenchFlow's flat form)."""
        return {"reward": self.reward, **self.items}

    def to_json(self) -> bytes:
        """The ``reward.json`` bytes (sorted keys, indented: the same result gives the same bytes)."""
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def parse_reward_json(content: bytes, where: str) -> VerifyResult | None:
    """The structured result of a ``reward.json``; None for the flat form (no `STRUCTURED_KEYS`).

    Args:
        content: the file's bytes.
        where: what to name in an error (the file).

    Raises:
        ValueError: the file is not JSON, not an object, or its structured form is invalid (the
            message names `where` and the field).
    """
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a JSON object")
    if not any(key in data for key in STRUCTURED_KEYS):
        return None
    try:
        return VerifyResult.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{where}: invalid structured reward: {exc}") from exc


def verdict_from_json(content: bytes, where: str) -> VerifyResult:
    """A ``reward.json`` in either form as a `VerifyResult`: the structured form as it is, the
    flat form (``{"reward": 0.75, "accuracy": 1.0}``, BenchFlow's) as its ``reward`` and the
    other numbers as items. What an agent judge writes as its verdict
    (`reroll.rollout.verify.agent_judge`).

    Args:
        content: the file's bytes.
        where: what to name in an error (the file).

    Raises:
        ValueError: not JSON, not an object, an invalid structured form, or a flat form without a
            numeric ``reward`` or with a value that is not a finite number (the message names
            `where` and the field).
    """
    structured = parse_reward_json(content, where)
    if structured is not None:
        return structured
    data = orjson.loads(content)  # parsed once already: valid JSON, an object
    if "reward" not in data:
        raise ValueError(f'{where} has no "reward" (and no "items": not the structured form either)')
    items = {name: value for name, value in data.items() if name != "reward"}
    try:
        return VerifyResult.model_validate({"reward": data["reward"], "items": items})
    except ValidationError as exc:
        raise ValueError(f"{where}: invalid reward: {exc}") from exc
