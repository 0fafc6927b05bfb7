"""compare_requests in the three API formats: normalisation, the reported place, classification."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from reroll_proxy.divergence import MAX_DIFF_LINES, compare_requests


def chat(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "gpt-a",
        "temperature": 0,
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "a.py\nb.py\n"},
        ],
    }
    return base | changes


def responses(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "gpt-a",
        "instructions": "You are an agent.",
        "tools": [{"type": "function", "name": "bash", "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "bash",
                "arguments": '{"command":"ls"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py\n"},
        ],
    }
    return base | changes


def anthropic(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "claude-a",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Fix the bug."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look.", "signature": "sig-1"},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py\n"}],
            },
        ],
    }
    return base | changes


FORMATS = {"openai-chat": chat, "openai-responses": responses, "anthropic-messages": anthropic}
CONVERSATION_KEY = {"openai-chat": "messages", "openai-responses": "input", "anthropic-messages": "messages"}
TOOL_RESULT = {"openai-chat": 3, "openai-responses": 4, "anthropic-messages": 3}
"""Index of the tool result in the normalised conversation (system prompt first)."""


def changed(name: str, edit: Any) -> dict[str, Any]:
    body = copy.deepcopy(FORMATS[name]())
    edit(body[CONVERSATION_KEY[name]])
    return body


def set_tool_output(name: str, text: str) -> Any:
    def edit(conversation: list[Any]) -> None:
        last = conversation[-1]
        if name == "openai-chat":
            last["content"] = text
        elif name == "openai-responses":
            last["output"] = text
        else:
            last["content"][0]["content"] = text

    return edit


@pytest.mark.parametrize("name", FORMATS)
def test_equal_requests_do_not_diverge(name: str) -> None:
    assert compare_requests(FORMATS[name](), FORMATS[name](), name) is None


@pytest.mark.parametrize("name", FORMATS)
def test_model_streaming_and_bookkeeping_are_ignored(name: str) -> None:
    live = FORMATS[name](model="other-model", stream=True, stream_options={"include_usage": True}, user="u")
    assert compare_requests(FORMATS[name](), live, name) is None


@pytest.mark.parametrize("name", FORMATS)
def test_changed_tool_output_is_an_observation_change(name: str) -> None:
    divergence = compare_requests(FORMATS[name](), changed(name, set_tool_output(name, "a.py\nc.py\n")), name)
    assert divergence is not None and divergence.classification == "observation_changed"
    index = TOOL_RESULT[name]
    assert divergence.message_index == index
    assert divergence.field.startswith(f"messages[{index}].content[0]")
    assert "-b.py" in divergence.diff and "+c.py" in divergence.diff and " a.py" in divergence.diff


@pytest.mark.parametrize("name", FORMATS)
def test_other_parameters_or_tools_are_an_agent_change(name: str) -> None:
    hotter = compare_requests(FORMATS[name](), FORMATS[name](temperature=1), name)
    assert hotter is not None and hotter.field == "params.temperature"
    assert hotter.classification == "agent_changed" and hotter.message_index is None
    fewer_tools = compare_requests(FORMATS[name](), FORMATS[name](tools=[]), name)
    assert fewer_tools is not None and fewer_tools.field == "tools[0]"
    assert fewer_tools.classification == "agent_changed" and '"bash"' in fewer_tools.diff


def test_chat_volatile_details_are_normalised() -> None:
    live = chat()
    live["messages"][1]["content"] = [
        {"type": "text", "text": "Fix ", "cache_control": {"type": "x"}},
        {"type": "text", "text": "the bug.  "},
    ]
    live["messages"][3] |= {"content": "  a.py\nb.py", "tool_call_id": "call_other"}
    live["messages"][2]["tool_calls"][0] |= {"id": "call_other"}
    live["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"command":"ls"}'
    live["messages"][0]["role"] = "developer"
    assert compare_requests(chat(), live) is None


def test_anthropic_volatile_details_are_normalised() -> None:
    live = anthropic(system="You are an agent.")
    live["messages"][1]["content"][0]["signature"] = "another"
    live["messages"][1]["content"][1]["id"] = "toolu_other"
    live["messages"][2]["content"][0] |= {
        "tool_use_id": "toolu_other",
        "content": [{"type": "text", "text": "a.py\nb.py"}],
    }
    assert compare_requests(anthropic(), live, "anthropic-messages") is None


def test_responses_string_input_and_ids() -> None:
    assert compare_requests(responses(input="hi"), responses(input=" hi "), "openai-responses") is None
    live = responses(previous_response_id="resp_2")
    live["input"][2] |= {"id": "fc_2", "call_id": "c2"}
    assert compare_requests(responses(previous_response_id="resp_1"), live, "openai-responses") is None


@pytest.mark.parametrize("name", FORMATS)
def test_other_tool_call_is_an_agent_change(name: str) -> None:
    def edit(conversation: list[Any]) -> None:
        if name == "openai-chat":
            conversation[2]["tool_calls"][0]["function"]["arguments"] = '{"command": "rm -rf /"}'
        elif name == "openai-responses":
            conversation[2]["arguments"] = '{"command": "rm -rf /"}'
        else:
            conversation[1]["content"][1]["input"] = {"command": "rm -rf /"}

    divergence = compare_requests(FORMATS[name](), changed(name, edit), name)
    assert divergence is not None and divergence.classification == "agent_changed"
    assert divergence.field.endswith(".arguments.command") and "rm -rf" in divergence.diff


def test_message_count_names_the_first_extra_message() -> None:
    longer = chat()
    longer["messages"] = [*longer["messages"], {"role": "user", "content": "more"}]
    divergence = compare_requests(chat(), longer)
    assert divergence is not None
    assert (divergence.field, divergence.message_index) == ("message_count", 4)
    assert divergence.classification == "observation_changed"
    assert "4 messages" in divergence.summary and "5" in divergence.summary
    assert "+user: more" in divergence.diff
    shorter_and_changed = chat()
    shorter_and_changed["messages"] = shorter_and_changed["messages"][:2]
    shorter_and_changed["messages"][1] = {"role": "user", "content": "Something else"}
    divergence = compare_requests(chat(), shorter_and_changed)
    assert divergence is not None and divergence.message_index == 1
    assert (
        divergence.field == "messages[1].content[0].text"
        and "recorded 4 messages, live 2" in divergence.summary
    )


def test_system_prompt_change_is_an_agent_change() -> None:
    divergence = compare_requests(anthropic(), anthropic(system="Be brief."), "anthropic-messages")
    assert divergence is not None and divergence.message_index == 0
    assert divergence.classification == "agent_changed"


def test_diff_is_at_most_forty_lines() -> None:
    recorded = changed(
        "openai-chat", set_tool_output("openai-chat", "\n".join(f"old {i}" for i in range(200)))
    )
    live = changed("openai-chat", set_tool_output("openai-chat", "\n".join(f"new {i}" for i in range(200))))
    divergence = compare_requests(recorded, live)
    assert divergence is not None
    lines = divergence.diff.splitlines()
    assert len(lines) == MAX_DIFF_LINES and lines[-1].startswith("... (") and "more lines" in lines[-1]


def test_missing_messages_compare_as_empty() -> None:
    assert compare_requests({}, {"messages": []}) is None
    divergence = compare_requests({}, chat(tools=None, temperature=None))
    assert divergence is not None and divergence.field == "message_count"


def test_unknown_format_is_named() -> None:
    with pytest.raises(KeyError, match="unknown API format 'gemini'"):
        compare_requests({}, {}, "gemini")
