"""Codex CLI's scripts and normalisation rules, without the agent: recorded Codex requests
(codex_requests.json: step 1 of hello-file, recorded and replayed in two local sandboxes) fed
to the scripted model's turn logic and to the proxy's volatile rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from reroll.agents import get_agent
from reroll_contracts.proxy import VolatileRule
from reroll_contracts.wire import format_named
from reroll_contracts.wire.normal import NormalRequest
from reroll_proxy.divergence import compare_normal
from reroll_proxy.scripted import answer_for, load_script
from reroll_proxy.scripted_answers import answer_body, turn_index
from reroll_proxy.translate import translation_for
from reroll_proxy.volatile import Volatility

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = json.loads((Path(__file__).with_name("codex_requests.json")).read_text())
RESPONSES = format_named("openai-responses")


def normal(body: dict[str, Any], root: str, agent_rules: bool = True) -> NormalRequest:
    rules = [VolatileRule(value=root, label="sandbox")]
    rules += get_agent("codex").volatile if agent_rules else []
    return RESPONSES.normalise(Volatility(rules).apply(body))


def test_two_runs_requests_are_equal_once_the_declared_volatile_parts_are_removed() -> None:
    roots = FIXTURE["sandbox_roots"]
    recorded = normal(FIXTURE["recorded"], roots["recorded"])
    replayed = normal(FIXTURE["replayed"], roots["replayed"])
    assert compare_normal(recorded, replayed) is None


def test_without_codex_rules_its_chunk_ids_and_session_ids_diverge() -> None:
    roots = FIXTURE["sandbox_roots"]
    recorded = normal(FIXTURE["recorded"], roots["recorded"], agent_rules=False)
    replayed = normal(FIXTURE["replayed"], roots["replayed"], agent_rules=False)
    divergence = compare_normal(recorded, replayed)
    assert divergence is not None and "Chunk ID" in divergence.diff
    divergence = compare_normal({**recorded, "messages": []}, {**replayed, "messages": []})
    assert divergence is not None and divergence.field.startswith("params.client_metadata")


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (
            "Chunk ID: 7ef4c3\nWall time: 0.9849 seconds\nProcess exited with code 0",
            "Process exited with code 0",
        ),
        ("<current_date>2026-11-23</current_date>", "<current-date>"),
        ("Wall time: 0.2511 seconds\nProcess running with session ID 88008\n", "<exec-session>"),
    ],
)
def test_the_patterns_replace_only_the_volatile_part(text: str, kept: str) -> None:
    applied = Volatility(get_agent("codex").volatile).apply({"t": text})["t"]
    assert kept in applied and not any(ch.isdigit() for ch in applied.split("Process")[0])


@pytest.mark.parametrize("task", ["fix-failing-test", "hello-file"])
def test_each_script_calls_codex_tools_and_ends_without_a_tool_call(task: str) -> None:
    script = load_script(ROOT / "examples" / "tasks" / task / "scripted-model.codex.yaml")
    offered = {tool.get("name") for tool in FIXTURE["recorded"]["tools"]}
    for turn in script.turns[:-1]:
        assert turn.tool_calls and {call.name for call in turn.tool_calls} <= offered
        assert all(isinstance(call.arguments, dict) and call.arguments.get("cmd") for call in turn.tool_calls)
    assert not script.turns[-1].tool_calls


def test_a_recorded_codex_request_gets_the_turn_of_its_history() -> None:
    body = FIXTURE["recorded"]  # one exec_command call and its output so far
    assert turn_index("openai-responses", body) == 1
    script = load_script(ROOT / "examples" / "tasks" / "hello-file" / "scripted-model.codex.yaml")
    answer = answer_body("openai-responses", answer_for(script.turns[1], 1), body)
    assert [item["type"] for item in answer["output"]] == ["message"]


def test_codex_continued_over_chat_or_messages_sheds_what_they_cannot_hold_with_notes() -> None:
    for upstream in ("openai-chat", "anthropic-messages"):
        translation = translation_for(RESPONSES, upstream)
        assert translation is not None
        forwarded, notes = translation.request_with_notes(FIXTURE["recorded"])
        assert "dropped tool web_search: no Chat counterpart" in notes
        assert "dropped tool namespace multi_agent_v1: no Chat counterpart" in notes
        assert {
            "dropped field include: no Chat counterpart",
            "dropped field reasoning: no Chat counterpart",
        } <= set(notes)
        names = [tool.get("name") or tool.get("function", {}).get("name") for tool in forwarded["tools"]]
        assert "exec_command" in names and "multi_agent_v1" not in names


def test_the_mail_calendar_script_calls_the_mcp_tools_codex_offers() -> None:
    """Every call names the tool group Codex made of the task's ``mail`` MCP server (recorded:
    codex_mcp_namespace.json) and one of its tools, with its required arguments and no other;
    the Responses answer carries the group as ``namespace`` beside the tool's own name."""
    recorded = json.loads((Path(__file__).with_name("codex_mcp_namespace.json")).read_text())["tool"]
    offered = {tool["name"]: tool["parameters"] for tool in recorded["tools"]}
    script = load_script(ROOT / "examples" / "tasks" / "mail-calendar" / "scripted-model.codex.yaml")
    called = []
    for index, turn in enumerate(script.turns[:-1]):
        for call in turn.tool_calls:
            assert call.namespace == recorded["name"] == "mcp__mail" and call.name in offered, call
            schema = offered[call.name]
            assert isinstance(call.arguments, dict)
            assert set(schema.get("required", [])) <= set(call.arguments) <= set(schema["properties"])
            called.append(call.name)
        body = answer_body("openai-responses", answer_for(turn, index), {"model": "m", "input": "x"})
        items = [item for item in body["output"] if item["type"] == "function_call"]
        assert [(item["namespace"], item["name"]) for item in items] == [
            ("mcp__mail", call.name) for call in turn.tool_calls
        ]
    assert called == ["list_messages", "read_message", "read_message", "list_events",
                      "archive_message", "reply_to_message", "book_event"]  # fmt: skip
    assert not script.turns[-1].tool_calls
