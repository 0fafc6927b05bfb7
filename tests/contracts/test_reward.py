"""Graded rewards (`reroll_contracts.reward`): reward.json's structured form, its flat form in
result.json, and clear errors for what is not one."""

from __future__ import annotations

import pytest
from reroll_contracts.reward import RewardEvent, VerifyResult, parse_reward_json, verdict_from_json

STRUCTURED = b"""{"reward": 0.75, "items": {"tests": 1.0, "style": 0.5},
 "events": [{"source": "ran-tests", "reward": 1.0, "step": 3, "space": "action", "granularity": "step"}],
 "space": "output", "granularity": "terminal"}"""


def test_the_structured_form_parses_and_flattens_as_benchflow_writes_rewards() -> None:
    graded = parse_reward_json(STRUCTURED, "reward.json")
    assert graded is not None
    assert graded.flat() == {"reward": 0.75, "tests": 1.0, "style": 0.5}
    assert graded.events == [
        RewardEvent(source="ran-tests", reward=1.0, step=3, space="action", granularity="step")
    ]
    assert parse_reward_json(graded.to_json(), "again") == graded  # the file round-trips
    assert graded.to_json() == VerifyResult.model_validate(graded.model_dump()).to_json()  # same bytes


def test_the_flat_form_is_no_structured_result() -> None:
    assert parse_reward_json(b'{"reward": 1.0, "exact_match": 1}', "reward.json") is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{", r"^/logs/verifier/reward\.json is not valid JSON"),
        (b"[1]", r"^/logs/verifier/reward\.json must be a JSON object"),
        (b'{"items": {"a": 1}}', r"(?s)^/logs/verifier/reward\.json: invalid structured reward:.*reward"),
        (b'{"reward": 1, "space": "vibes"}', r"(?s)invalid structured reward:.*space"),
        (b'{"reward": 1, "items": {"reward": 1}}', r"(?s)may not be named 'reward'"),
        (b'{"reward": 1, "events": [{"source": "x", "reward": 1, "step": -1}]}', r"(?s)events\.0\.step"),
        (b'{"reward": 1, "events": [{"reward": 1}]}', r"(?s)events\.0\.source"),
        (b'{"reward": 1, "items": {"a": NaN}}', r"not valid JSON|not a finite number"),
    ],
)
def test_an_invalid_structured_reward_names_the_file_and_the_field(content: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_reward_json(content, "/logs/verifier/reward.json")


def test_a_verdict_is_either_form_as_a_verify_result() -> None:
    structured = verdict_from_json(STRUCTURED, "verdict")
    assert structured == parse_reward_json(STRUCTURED, "verdict")
    flat = verdict_from_json(b'{"reward": 0.25, "tone": 1}', "verdict")
    assert flat == VerifyResult(reward=0.25, items={"tone": 1.0})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"verdict\.json is not valid JSON"),
        (b"[0.5]", r"verdict\.json must be a JSON object"),
        (b'{"score": 0.5}', r"verdict\.json has no \"reward\""),
        (b'{"reward": "high"}', r"verdict\.json: invalid reward"),
        (b'{"reward": 1.0, "tone": "good"}', r"verdict\.json: invalid reward"),
        (b'{"reward": 1.0, "items": {"tone": "x"}}', r"verdict\.json: invalid structured reward"),
    ],
)
def test_a_verdict_that_is_no_reward_names_the_file(content: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdict_from_json(content, "verdict.json")
