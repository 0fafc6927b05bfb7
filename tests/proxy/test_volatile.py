"""Volatile rules: paths dropped, values and patterns replaced, bad rules refused, carried by ProxyConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from reroll_contracts.proxy import ProxyConfig, VolatileRule
from reroll_proxy.volatile import Volatility

BODY = {
    "metadata": {"user_id": "u-123", "keep": 1},
    "client_metadata": {"session_id": "s-9"},
    "messages": [
        {"role": "system", "content": "cwd /tmp/root-1/app (root /tmp/root-1) at 2026-11-23T19:12:06.123456"},
        {"role": "tool", "content": [{"type": "text", "text": "Chunk ID: 7f3a\\nok", "cache_control": {}}]},
    ],
}


def test_paths_drop_values_and_star_matches_every_key_or_element() -> None:
    rules = [
        VolatileRule(path="metadata.user_id"),
        VolatileRule(path="messages.*.content.*.cache_control"),
        VolatileRule(path="client_metadata"),
        VolatileRule(path="absent.path.0"),
    ]
    applied = Volatility(rules).apply(BODY)
    assert applied["metadata"] == {"keep": 1} and "client_metadata" not in applied
    assert applied["messages"][1]["content"][0] == {"type": "text", "text": "Chunk ID: 7f3a\\nok"}
    assert BODY["metadata"] == {"user_id": "u-123", "keep": 1}  # the body itself is untouched


def test_a_numeric_path_part_names_one_element() -> None:
    assert Volatility([VolatileRule(path="a.1")]).apply({"a": [1, 2, 3]}) == {"a": [1, 3]}
    assert Volatility([VolatileRule(path="a.5")]).apply({"a": [1]}) == {"a": [1]}


def test_values_longest_first_then_patterns() -> None:
    rules = [
        VolatileRule(value="/tmp/root-1", label="sandbox"),
        VolatileRule(value="/tmp/root-1/app", label="workspace"),
        VolatileRule(pattern=r"\d{4}-\d{2}-\d{2}T[\d:.]+", label="datetime"),
        VolatileRule(pattern=r"Chunk ID: \w+"),
    ]
    messages = Volatility(rules).apply(BODY)["messages"]
    assert messages[0]["content"] == "cwd <workspace> (root <sandbox>) at <datetime>"
    assert messages[1]["content"][0]["text"] == "<volatile>\\nok"


def test_no_rules_return_the_body_itself() -> None:
    assert Volatility().apply(BODY) is BODY


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "exactly one of path, pattern, value"),
        ({"path": "a", "value": "b"}, "exactly one of path, pattern, value"),
        ({"pattern": "("}, "is not a regular expression"),
        ({"value": "x", "colour": "red"}, "Extra inputs are not permitted"),
    ],
)
def test_bad_rules_are_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        VolatileRule.model_validate(fields)


def test_proxy_config_carries_the_rules(tmp_path: Path) -> None:
    config = ProxyConfig(
        token="t",
        trajectory_path=tmp_path / "t.jsonl",
        volatile=[VolatileRule(value="/app", label="workspace")],
    )
    again = ProxyConfig.model_validate_json(config.model_dump_json())
    assert again.volatile == [VolatileRule(value="/app", label="workspace")]
