"""The Chat ↔ Anthropic field mapping and the translation seam, fed bodies (no I/O)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from reroll_contracts.errors import TranslationError
from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire import format_named
from reroll_proxy.chat_anthropic import (
    DEFAULT_MAX_TOKENS,
    chat_to_messages,
    completion_to_message,
    message_to_completion,
    messages_to_chat,
)
from reroll_proxy.respond import EventSource
from reroll_proxy.translate import translation_for

CHAT_REQUEST = {
    "model": "gpt-x",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use bash."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command":"ls"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": "And now?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {"name": "bash", "description": "Run a command.", "parameters": {"type": "object"}},
        }
    ],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "max_completion_tokens": 300,
    "temperature": 0.2,
    "stop": "END",
    "seed": 7,
    "user": "u-1",
    "stream": True,
}


def test_a_chat_request_becomes_a_messages_request() -> None:
    assert chat_to_messages(CHAT_REQUEST) == {
        "model": "gpt-x",
        "max_tokens": 300,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use bash."}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "call_2", "name": "bash", "input": {}},
                ],
            },
            {
                "role": "user",  # both tool results and the next user turn: one user message
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_2",
                        "content": [{"type": "text", "text": "done"}],
                    },
                    {"type": "text", "text": "And now?"},
                ],
            },
        ],
        "temperature": 0.2,
        "stream": True,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "tools": [{"name": "bash", "description": "Run a command.", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }


def test_a_chat_request_without_a_limit_gets_the_default() -> None:
    translated = chat_to_messages({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert translated["max_tokens"] == DEFAULT_MAX_TOKENS and "system" not in translated


def test_a_messages_request_becomes_a_chat_request_and_back() -> None:
    messages = chat_to_messages(CHAT_REQUEST)
    chat = messages_to_chat(messages)
    assert chat["messages"][0] == {"role": "system", "content": "Be brief.Use bash."}
    assert chat["messages"][2]["tool_calls"][0]["function"] == {
        "name": "bash",
        "arguments": '{"command":"ls"}',
    }
    assert chat["messages"][3:5] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "call_2", "content": "done"},
    ]
    assert chat["stream_options"] == {"include_usage": True} and chat["stop"] == ["END"]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    again = chat_to_messages(chat)
    assert again["messages"][:2] == messages["messages"][:2] and again["tools"] == messages["tools"]
    # Chat tool messages carry text: a result's text blocks come back as one string.
    assert again["messages"][2]["content"][1] == {
        "type": "tool_result",
        "tool_use_id": "call_2",
        "content": "done",
    }


def test_a_message_becomes_a_completion_and_back() -> None:
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 3},
    }
    completion = message_to_completion(message)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Listing.",
        "reasoning_content": "Hmm.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command":"ls"}'},
            }
        ],
    }
    assert completion["usage"] == {"prompt_tokens": 15, "completion_tokens": 3, "total_tokens": 18}
    back = completion_to_message(completion)
    assert back["content"] == message["content"][1:] and back["stop_reason"] == "tool_use"
    assert back["usage"] == {"input_tokens": 15, "output_tokens": 3}


@pytest.mark.parametrize(("stop", "finish"), [("end_turn", "stop"), ("max_tokens", "length"), (None, "stop")])
def test_stop_reasons_map(stop: str | None, finish: str) -> None:
    assert (
        message_to_completion({"content": [], "stop_reason": stop})["choices"][0]["finish_reason"] == finish
    )


def test_an_upstream_error_gets_the_agent_shape_and_keeps_its_status() -> None:
    translation = translation_for(format_named("openai-chat"), "anthropic-messages")
    assert translation is not None
    upstream_error = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    agent_error = json.loads(translation.response_payload(529, upstream_error))
    assert (
        agent_error["error"]["type"] == "overloaded_error" and agent_error["error"]["message"] == "Overloaded"
    )


def test_a_non_object_answer_is_an_error_for_the_agent() -> None:
    translation = translation_for(format_named("anthropic-messages"), "openai-chat")
    assert translation is not None
    agent_error = json.loads(translation.response_payload(200, b"<html>gateway</html>"))
    assert agent_error["type"] == "error" and "gateway" in agent_error["error"]["message"]


def test_same_format_needs_no_translation_and_untranslatable_parts_are_named() -> None:
    chat = format_named("openai-chat")
    assert translation_for(chat, None) is None and translation_for(chat, "openai-chat") is None
    translation = translation_for(chat, "anthropic-messages")
    assert translation is not None
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
    with pytest.raises(TranslationError, match=r"openai-chat → anthropic-messages: .*'input_audio'"):
        translation.request({"messages": [audio]})
    bad_arguments = {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
    with pytest.raises(TranslationError, match=r"call_9.*not JSON"):
        translation.request({"messages": [{"role": "assistant", "tool_calls": [bad_arguments]}]})


async def test_a_stream_is_assembled_then_re_emitted_in_the_agent_format() -> None:
    anthropic = format_named("anthropic-messages")
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls -la"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 4, "output_tokens": 2},
    }
    upstream = EventSource(anthropic.to_events(message, {}, piece_chars=3))
    translation = translation_for(format_named("openai-chat"), "anthropic-messages")
    assert translation is not None
    request = {"stream": True, "stream_options": {"include_usage": True}}
    batches = [batch async for batch in translation.events(upstream, request).batches()]
    assert len(batches) == 1 and batches[0][-1] == SseEvent(data="[DONE]")
    completion = format_named("openai-chat").assemble(batches[0])
    assert (
        completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        == '{"command":"ls -la"}'
    )
    assert completion["usage"]["total_tokens"] == 6


def test_what_chat_cannot_hold_of_a_claude_code_request_is_noted_not_refused() -> None:
    from reroll_proxy.chat_anthropic import messages_dropped, messages_to_chat

    body = {
        "model": "m", "max_tokens": 32000, "stream": True,
        "thinking": {"type": "adaptive"}, "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
            {"role": "system", "content": "cwd: /app"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
        ],
    }  # fmt: skip
    chat = messages_to_chat(body)
    assert not {"thinking", "context_management", "output_config"} & set(chat)
    assert [m["role"] for m in chat["messages"]] == ["user", "system", "assistant", "tool"]
    notes = messages_dropped(body, {"anthropic-beta": "claude-code-20250219,effort-2025-11-24"})
    assert notes == [
        "field context_management", "field output_config", "field thinking", "1 thinking block(s)",
        "betas claude-code-20250219,effort-2025-11-24",
    ]  # fmt: skip
    assert messages_dropped({"model": "m", "messages": []}, {}) == []
