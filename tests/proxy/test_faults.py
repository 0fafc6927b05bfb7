"""The fault plan model, its loader, and the selector (pure: fed requests, no sockets)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from reroll_contracts.errors import FaultPlanError
from reroll_contracts.faults import FaultPlan, StatusFault, load_plan
from reroll_contracts.wire import format_named
from reroll_proxy.faults import FaultSelector, last_message_text, status_response

PATH = "/v1/chat/completions"


def plan(*rules: dict[str, object], seed: int = 0) -> FaultPlan:
    return FaultPlan.model_validate({"seed": seed, "rules": list(rules)})


def kinds(selector: FaultSelector, steps: range, *, text: str = "") -> list[str | None]:
    notes = [selector.choose(step, PATH, text) for step in steps]
    return [note.spec.kind if note else None for note in notes]


def test_load_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(
        "seed: 3\nrules:\n  - name: burst\n    from_step: 1\n    times: 2\n"
        "    fault: {kind: status, status_code: 429, retry_after_seconds: 1}\n"
    )
    loaded = load_plan(path)
    assert loaded.seed == 3 and loaded.rules[0].fault == StatusFault(status_code=429, retry_after_seconds=1)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("rules: [{fault: {kind: status, status_code: 429}, when: 3}]", "Extra inputs are not permitted"),
        ("rules: [{fault: {kind: explode}}]", "does not match any of the expected tags"),
        ("rules: [{fault: {kind: status, status_code: 200}}]", "greater than or equal to 400"),
        ("rules: [{last_message_regex: '(', fault: {kind: reset}}]", "not a regular expression"),
        ("rules: [{probability: 2, fault: {kind: reset}}]", "less than or equal to 1"),
        ("rules: [{fault: {kind: latency}}]", "seconds"),
        ("rules: [\n", "not YAML"),
        ("- 1\n", "invalid fault plan"),
    ],
)
def test_bad_plans_name_the_file_and_cause(tmp_path: Path, text: str, cause: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(FaultPlanError) as caught:
        load_plan(path)
    assert str(path) in str(caught.value) and cause in str(caught.value)


def test_missing_plan_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FaultPlanError, match=r"missing\.yaml: cannot read"):
        load_plan(tmp_path / "missing.yaml")


def test_steps_from_step_and_times() -> None:
    selector = FaultSelector(
        plan(
            {"steps": [0], "fault": {"kind": "reset"}},
            {"from_step": 3, "times": 2, "fault": {"kind": "status", "status_code": 503}},
        )
    )
    assert kinds(selector, range(7)) == ["reset", None, None, "status", "status", None, None]
    assert selector.injected == {"rule-0": 1, "rule-1": 2}


def test_first_matching_rule_wins_and_names() -> None:
    selector = FaultSelector(
        plan(
            {"name": "slow", "fault": {"kind": "latency", "seconds": 1}},
            {"fault": {"kind": "reset"}},
        )
    )
    note = selector.choose(0, PATH, "")
    assert note is not None and note.rule == "slow" and note.spec.kind == "latency"


def test_match_by_path_and_last_message() -> None:
    selector = FaultSelector(
        plan(
            {"path": "/v1/messages", "fault": {"kind": "reset"}},
            {"last_message_contains": "pytest", "fault": {"kind": "malformed"}},
            {"last_message_regex": r"exit code \d+", "fault": {"kind": "status", "status_code": 500}},
        )
    )
    assert selector.choose(0, "/v1/messages", "") is not None
    assert kinds(selector, range(1), text="run pytest now") == ["malformed"]
    assert kinds(selector, range(1), text="exit code 2") == ["status"]
    assert kinds(selector, range(1), text="exit code x") == [None]


def test_probability_is_reproducible_per_seed() -> None:
    rule = {"probability": 0.3, "fault": {"kind": "status", "status_code": 500}}
    first = kinds(FaultSelector(plan(rule, seed=11)), range(200))
    again = kinds(FaultSelector(plan(rule, seed=11)), range(200))
    other = kinds(FaultSelector(plan(rule, seed=11), seed=12), range(200))
    assert first == again and first != other
    assert 30 < first.count("status") < 90  # about 60 of 200


def test_probability_draw_depends_only_on_seed_rule_and_step() -> None:
    rule = {"probability": 0.5, "fault": {"kind": "status", "status_code": 500}}
    every = kinds(FaultSelector(plan(rule)), range(50))
    evens = FaultSelector(plan(rule))
    assert [every[step] for step in range(0, 50, 2)] == kinds(evens, range(0, 50, 2))


def test_last_message_text_per_format() -> None:
    chat = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "tool", "tool_call_id": "1", "content": "out"},
        ]
    }
    assert last_message_text(format_named("openai-chat"), chat) == "out"
    messages = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]}
    assert last_message_text(format_named("anthropic-messages"), messages) == "hello"
    assert last_message_text(format_named("openai-chat"), {"messages": []}) == ""


@pytest.mark.parametrize(
    ("api", "status", "kind"),
    [
        ("openai-chat", 429, "rate_limit_exceeded"),
        ("openai-responses", 500, "api_error"),
        ("anthropic-messages", 529, "overloaded_error"),
        ("anthropic-messages", 429, "rate_limit_error"),
    ],
)
def test_status_response_shape(api: str, status: int, kind: str) -> None:
    code, headers, body = status_response(
        format_named(api), StatusFault(status_code=status, retry_after_seconds=2)
    )
    error = orjson.loads(body)["error"]
    assert code == status and error["type"] == kind
    assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"


@pytest.mark.parametrize(
    "plan_file", sorted((Path(__file__).resolve().parents[2] / "examples" / "faults").glob("*.yaml"))
)
def test_example_plans_load(plan_file: Path) -> None:
    assert load_plan(plan_file).rules
