"""The Responses → Chat mapping, fed bodies (no I/O)."""

from __future__ import annotations

import pytest
from reroll_proxy.chat_anthropic import UntranslatableError
from reroll_proxy.responses_chat import completion_to_response, responses_to_chat


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
def test_what_chat_cannot_hold_is_named(request_body: dict, named: str) -> None:
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
