"""The Responses ↔ Chat mapping, both directions, fed bodies (no I/O)."""

from __future__ import annotations

from typing import Any

import pytest
from reroll_contracts.errors import UntranslatableError
from reroll_proxy.responses_chat import (
    chat_to_responses,
    completion_to_response,
    response_to_completion,
    responses_to_chat,
)


def test_a_responses_request_becomes_a_chat_request() -> None:
    request = {
        "model": "gpt-x",
        "instructions": "Be brief.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": "https://x/y.png"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Listing."}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"command":"ls"}'},
            {"type": "function_call", "call_id": "call_2", "name": "bash", "arguments": ""},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "ok"}],
            },
        ],
        "tools": [
            {"type": "function", "name": "bash", "description": "Run.", "parameters": {"type": "object"}}
        ],
        "tool_choice": {"type": "function", "name": "bash"},
        "max_output_tokens": 200,
        "stream": True,
        "store": False,
    }
    assert responses_to_chat(request) == {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Listing.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"ls"}'},
                    },
                    {"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
            {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
        ],
        "max_tokens": 200,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {"name": "bash", "parameters": {"type": "object"}, "description": "Run."},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "bash"}},
    }


def test_a_string_input_is_one_user_message() -> None:
    assert responses_to_chat({"model": "m", "input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("request_body", "named"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "'web_search'"),
        ({"input": [{"type": "file_search_call"}]}, "'file_search_call'"),
    ],
)
def test_what_chat_cannot_hold_is_named(request_body: dict[str, Any], named: str) -> None:
    with pytest.raises(UntranslatableError, match=named):
        responses_to_chat(request_body)


def test_a_completion_becomes_a_response() -> None:
    completion = {
        "id": "chatcmpl-1",
        "created": 7,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "length",
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "reasoning_content": "Hmm.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }
    response = completion_to_response(completion)
    assert [item["type"] for item in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][2] == {
        "id": "fc_call_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "f",
        "arguments": "{}",
        "status": "completed",
    }
    assert response["status"] == "incomplete" and response["incomplete_details"] == {
        "reason": "max_output_tokens"
    }
    assert response["usage"]["input_tokens"] == 5 and response["usage"]["total_tokens"] == 7


def test_a_chat_request_becomes_a_responses_request() -> None:
    request = {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use bash."}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Listing.",
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
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "ok"}]},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "user", "content": "Thanks."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "bash", "description": "Run.", "parameters": {"type": "object"}},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "bash"}},
        "max_tokens": 200,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "seed": None,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}},
        },
    }
    assert chat_to_responses(request) == {
        "model": "gpt-x",
        "instructions": "Be brief.\n\nUse bash.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
                ],
            },
            {"type": "message", "role": "assistant", "content": "Listing."},
            {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": '{"command":"ls"}'},
            {"type": "function_call", "call_id": "call_2", "name": "bash", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "function_call_output", "call_id": "call_2", "output": "ok"},
            {"type": "message", "role": "user", "content": "Thanks."},
        ],
        "store": False,
        "max_output_tokens": 200,
        "temperature": 0.0,
        "stream": True,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        "tools": [
            {"type": "function", "name": "bash", "parameters": {"type": "object"}, "description": "Run."}
        ],
        "tool_choice": {"type": "function", "name": "bash"},
    }


def test_a_chat_request_round_trips_through_responses() -> None:
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
        "max_completion_tokens": 50,
    }  # fmt: skip
    back = responses_to_chat(chat_to_responses(chat))
    assert back == {"model": "m", "messages": chat["messages"], "max_tokens": 50}


@pytest.mark.parametrize(
    ("request_body", "named"),
    [
        ({"n": 3}, "'n' = 3"),
        ({"logprobs": True}, "'logprobs'"),
        ({"top_logprobs": 2}, "'top_logprobs'"),
        ({"stop": ["\n"]}, "'stop'"),
        ({"seed": 7}, "'seed'"),
        ({"modalities": ["text", "audio"]}, "audio"),
        ({"functions": [{"name": "f"}]}, "'functions'"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "role 'function'"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "'input_audio'"),
        ({"tools": [{"type": "custom", "custom": {"name": "g"}}]}, "tool of type 'custom'"),
    ],
)
def test_what_responses_cannot_hold_is_named(request_body: dict[str, Any], named: str) -> None:
    with pytest.raises(UntranslatableError, match=named):
        chat_to_responses({"model": "m", "messages": [{"role": "user", "content": "hi"}]} | request_body)


def test_neutral_values_of_refused_params_pass() -> None:
    neutral = {"n": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0.0, "stop": None}
    assert chat_to_responses({"model": "m", "messages": []} | neutral) == {
        "model": "m",
        "input": [],
        "store": False,
    }


def test_the_provider_stores_the_response_only_when_the_chat_request_asked() -> None:
    """Chat's ``store`` defaults to false, Responses' to true: the translation keeps Chat's."""
    assert chat_to_responses({"model": "m", "messages": []})["store"] is False
    assert chat_to_responses({"model": "m", "messages": [], "store": True})["store"] is True


def test_a_response_becomes_a_completion() -> None:
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 7,
        "model": "m",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [
            {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Hmm."}]},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
            },
            {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
            {"id": "ws_1", "type": "web_search_call", "status": "completed"},
        ],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 1},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 1},
            "total_tokens": 7,
        },
    }
    completion = response_to_completion(response)
    assert completion["choices"] == [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": "Hi",
                "reasoning_content": "Hmm.",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
        }
    ]
    assert completion["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 1},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    assert completion["object"] == "chat.completion" and completion["created"] == 7


@pytest.mark.parametrize(
    ("details", "finish"),
    [
        (None, "stop"),
        ({"reason": "max_output_tokens"}, "length"),
        ({"reason": "content_filter"}, "content_filter"),
    ],
)
def test_a_text_answer_keeps_why_it_ended(details: dict[str, Any] | None, finish: str) -> None:
    text = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
    refused = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    choice = response_to_completion({"output": [text, refused], "incomplete_details": details})["choices"][0]
    assert choice["finish_reason"] == finish
    assert choice["message"] == {"role": "assistant", "content": "ok", "refusal": "no"}
