"""Which turn a request is at, in each API format (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from reroll_contracts.errors import RequestShapeError
from reroll_proxy.scripted_answers import Answer, ToolCall, answer_body, turn_index


def test_chat_and_messages_count_assistant_messages() -> None:
    messages = [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "assistant"}]
    assert turn_index("openai-chat", {"messages": messages}) == 2
    assert turn_index("anthropic-messages", {"messages": messages[:2]}) == 1


def test_responses_count_runs_of_model_items_and_the_previous_response() -> None:
    items: list[Any] = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": []},
        {"type": "function_call", "call_id": "c", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
        {"type": "function_call", "call_id": "d", "name": "bash", "arguments": "{}"},
    ]
    assert turn_index("openai-responses", {"input": "go"}) == 0
    assert turn_index("openai-responses", {"input": items}) == 2
    chained = {"input": items[4:5], "previous_response_id": "resp_scripted_3"}
    assert turn_index("openai-responses", chained) == 4


@pytest.mark.parametrize(
    ("api_format", "body", "expected"),
    [
        ("openai-chat", {"messages": "hi"}, "'messages' list"),
        ("anthropic-messages", {}, "'messages' list"),
        ("openai-responses", {"input": 3}, "'input' string or list"),
    ],
)
def test_requests_without_a_conversation_are_refused(api_format: str, body: Any, expected: str) -> None:
    with pytest.raises(RequestShapeError, match=expected):
        turn_index(api_format, body)


def test_answers_carry_thinking_in_each_format() -> None:
    answer = Answer(index=1, content=None, tool_calls=[ToolCall("bash", '{"command": "ls"}')], thinking="hm")
    request = {"model": "m", "messages": []}
    chat = answer_body("openai-chat", answer, request)["choices"][0]
    assert chat["message"]["reasoning_content"] == "hm" and chat["finish_reason"] == "tool_calls"
    response = answer_body("openai-responses", answer, request)
    assert [item["type"] for item in response["output"]] == ["reasoning", "function_call"]
    message = answer_body("anthropic-messages", answer, request)
    assert [block["type"] for block in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][1]["input"] == {"command": "ls"} and message["stop_reason"] == "tool_use"


def test_a_namespaced_call_is_grouped_in_responses_and_prefixed_elsewhere() -> None:
    """Codex offers an MCP server's tools as a Responses ``namespace`` (``mcp__mail``) and runs a
    call only when it names both; the formats without groups get the prefixed name."""
    call = ToolCall("list_messages", '{"folder": "inbox"}', "mcp__mail")
    answer = Answer(index=0, content=None, tool_calls=[call], thinking=None)
    request = {"model": "m", "messages": []}
    (item,) = answer_body("openai-responses", answer, request)["output"]
    assert (item["namespace"], item["name"]) == ("mcp__mail", "list_messages")
    chat = answer_body("openai-chat", answer, request)["choices"][0]["message"]
    assert chat["tool_calls"][0]["function"]["name"] == "mcp__mail__list_messages"
    (block,) = answer_body("anthropic-messages", answer, request)["content"]
    assert block["name"] == "mcp__mail__list_messages"
