"""The per-format modules, fed by hand: stream splitting and assembly, terminal events, headers, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from reroll_contracts.wire import all_formats, format_for_path, format_named
from reroll_contracts.wire.sse import SseParser, encode_event
from reroll_proxy.scripted_answers import Answer, ToolCall, answer_body

ANSWER = Answer(
    index=2,
    content="Hello — wörld 🚀, a long enough text",
    tool_calls=[ToolCall("bash", '{"command": "ls"}')],
    thinking="Think.",
)
GROUPED = Answer(
    index=0, content=None, tool_calls=[ToolCall("list_messages", "{}", "mcp__mail")], thinking=None
)
"""A call in a tool group (Codex's MCP tools: a Responses ``namespace``), which the stream keeps."""


@pytest.mark.parametrize("wire", all_formats(), ids=lambda wire: wire.name)
@pytest.mark.parametrize("piece_chars", [1, 5, 1000])
@pytest.mark.parametrize("answer", [ANSWER, GROUPED], ids=["plain", "grouped"])
def test_events_fold_back_into_the_body_over_the_wire(wire: Any, piece_chars: int, answer: Answer) -> None:
    body = answer_body(wire.name, answer, {"model": "m", "messages": [], "input": "x"})
    events = wire.to_events(body, {"stream_options": {"include_usage": True}}, piece_chars=piece_chars)
    for choice in body.get("choices", []):
        choice.pop("logprobs")  # not streamed by the chat splitter
    parser = SseParser()
    wire_bytes = b"".join(encode_event(event) for event in events)
    parsed = [e for start in range(0, len(wire_bytes), 7) for e in parser.feed(wire_bytes[start : start + 7])]
    assert parsed + parser.finish() == events
    assert wire.assemble(events) == body
    assert [wire.is_terminal(event) for event in events] == [False] * (len(events) - 1) + [True]
    # the proxy forwards bytes with no terminal marker unparsed: the terminal event must have one
    (terminal,) = [encode_event(event) for event in events if wire.is_terminal(event)]
    assert any(marker in terminal for marker in wire.terminal_markers)


def test_anthropic_stream_has_the_documented_event_sequence() -> None:
    wire = format_named("anthropic-messages")
    body = answer_body(wire.name, ANSWER, {"messages": []})
    names = [event.event for event in wire.to_events(body, {}, piece_chars=1000)]
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    thinking = ["content_block_start", "content_block_delta", "content_block_delta", "content_block_stop"]
    assert names == ["message_start", "ping", *thinking, *block, *block, "message_delta", "message_stop"]
    assert all(json.loads(event.data)["type"] == event.event for event in wire.to_events(body, {}))


def test_responses_events_are_numbered_and_a_cut_stream_keeps_its_items() -> None:
    wire = format_named("openai-responses")
    body = answer_body(wire.name, ANSWER, {"input": "x"})
    events = wire.to_events(body, {})
    assert [json.loads(event.data)["sequence_number"] for event in events] == list(range(len(events)))
    cut = wire.assemble(events[:-1])
    assert cut["status"] == "in_progress" and cut["output"] == body["output"]


def test_upstream_credentials_per_format() -> None:
    agent_headers = {"anthropic-beta": "tools-2024", "authorization": "Bearer rollout-token"}
    assert format_named("openai-chat").upstream_headers("sk-1", agent_headers) == {
        "Authorization": "Bearer sk-1"
    }
    assert format_named("openai-responses").upstream_headers(None, agent_headers) == {}
    assert format_named("anthropic-messages").upstream_headers("sk-2", agent_headers) == {
        "anthropic-beta": "tools-2024",
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-2",
    }


def test_error_bodies_have_each_api_shape() -> None:
    openai_error = json.loads(format_named("openai-responses").error_body("replay_exhausted", "no more"))
    assert openai_error == {
        "error": {"message": "no more", "type": "replay_exhausted", "param": None, "code": "replay_exhausted"}
    }
    anthropic_error = json.loads(format_named("anthropic-messages").error_body("replay_exhausted", "no more"))
    assert anthropic_error == {"type": "error", "error": {"type": "replay_exhausted", "message": "no more"}}


def test_paths_and_names() -> None:
    assert format_for_path("/v1/messages") is format_named("anthropic-messages")
    assert format_for_path("/responses") is format_named("openai-responses")
    assert format_for_path("/v1/embeddings") is None
    assert format_for_path("/v1/messages?beta=true") is format_named("anthropic-messages")
    with pytest.raises(
        KeyError, match=r"unknown API format 'x'.*openai-chat, openai-responses, anthropic-messages"
    ):
        format_named("x")
