"""`WireFormat.normalise_response`: each format's answer in the common shape (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from reroll_contracts.wire import all_formats, format_named

CHAT_ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "  Two calls.\n",
                "reasoning_content": "Look first.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"id": 7}'}},
                    {"id": "c2", "type": "function", "function": {"name": "cat", "arguments": "not json"}},
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 50, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 20}},
}
EXPECTED_BLOCKS = [
    {"type": "thinking", "text": "Look first."},
    {"type": "text", "text": "  Two calls.\n"},
    {"type": "tool_call", "id": "c1", "name": "ls", "arguments": {"id": 7}},
    {"type": "tool_call", "id": "c2", "name": "cat", "arguments": "not json"},
]

RESPONSES_ANSWER: dict[str, Any] = {
    "object": "response",
    "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "Look first."}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "  Two calls.\n"}],
        },
        {"type": "function_call", "id": "fc1", "call_id": "c1", "name": "ls", "arguments": '{"id": 7}'},
        {"type": "function_call", "id": "fc2", "call_id": "c2", "name": "cat", "arguments": "not json"},
    ],
    "usage": {"input_tokens": 50, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 20}},
}

ANTHROPIC_ANSWER: dict[str, Any] = {
    "type": "message",
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "Look first.", "signature": "sig"},
        {"type": "redacted_thinking", "data": "xyz"},
        {"type": "text", "text": "  Two calls.\n"},
        {"type": "tool_use", "id": "c1", "name": "ls", "input": {"id": 7}},
        {"type": "tool_use", "id": "c2", "name": "cat", "input": "not json"},
    ],
    "stop_reason": "tool_use",
    "usage": {
        "input_tokens": 25,
        "cache_read_input_tokens": 20,
        "cache_creation_input_tokens": 5,
        "output_tokens": 5,
    },
}

ANSWERS = {
    "openai-chat": CHAT_ANSWER,
    "openai-responses": RESPONSES_ANSWER,
    "anthropic-messages": ANTHROPIC_ANSWER,
}
STOP_REASONS = {
    "openai-chat": "tool_calls",
    "openai-responses": "completed",
    "anthropic-messages": "tool_use",
}


@pytest.mark.parametrize("name", list(ANSWERS))
def test_every_format_gives_the_same_verbatim_answer_with_ids_and_usage(name: str) -> None:
    normal = format_named(name).normalise_response(ANSWERS[name])
    assert normal["message"] == {"role": "assistant", "content": EXPECTED_BLOCKS}
    assert normal["usage"] == {"prompt_tokens": 50, "completion_tokens": 5, "cached_tokens": 20}
    assert normal["stop_reason"] == STOP_REASONS[name]


@pytest.mark.parametrize("name", list(ANSWERS))
def test_a_streamed_answer_normalises_like_the_body(name: str) -> None:
    wire = format_named(name)
    assembled = wire.assemble(
        wire.to_events(ANSWERS[name], {"stream": True, "stream_options": {"include_usage": True}})
    )
    assert wire.normalise_response(assembled)["message"] == wire.normalise_response(ANSWERS[name])["message"]


def test_an_answer_without_usage_or_content_is_empty() -> None:
    for wire in all_formats():
        normal = wire.normalise_response({})
        assert normal["message"] == {"role": "assistant", "content": []}
        assert normal["usage"] is None


def test_anthropic_usage_without_cache_fields_has_none_cached() -> None:
    body = {"content": [], "usage": {"input_tokens": 9, "output_tokens": 1}}
    usage = format_named("anthropic-messages").normalise_response(body)["usage"]
    assert usage == {"prompt_tokens": 9, "completion_tokens": 1, "cached_tokens": 0}
