"""compare_requests: what counts as a divergence and how it is reported."""

from __future__ import annotations

import copy
from typing import Any

from reroll_proxy.divergence import MAX_DIFF_LINES, compare_requests


def body(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "gpt-a",
        "temperature": 0,
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


def with_message(index: int, **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(body())
    changed["messages"][index] |= fields
    return changed


def test_equal_requests_do_not_diverge() -> None:
    assert compare_requests(body(), body()) is None


def test_model_and_parameters_are_not_divergence() -> None:
    assert compare_requests(body(), body(model="other-model", temperature=1, tools=[{"x": 1}])) is None


def test_volatile_details_are_normalised() -> None:
    live = with_message(
        1, content=[{"type": "text", "text": "Fix the bug.  ", "cache_control": {"type": "x"}}]
    )
    live["messages"][3]["content"] = "  a.py\nb.py"
    live["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"command":"ls"}'
    live["messages"][0]["name"] = "ignored"
    assert compare_requests(body(), live) is None


def test_changed_tool_output_is_reported_with_a_diff() -> None:
    divergence = compare_requests(body(), with_message(3, content="a.py\nc.py\n"))
    assert divergence is not None
    assert (divergence.message_index, divergence.field) == (3, "messages[3].content")
    assert "messages[3].content" in divergence.summary and "'tool'" in divergence.summary
    assert "-b.py" in divergence.diff and "+c.py" in divergence.diff and " a.py" in divergence.diff


def test_tool_call_id_name_and_arguments_count() -> None:
    renamed = with_message(3, tool_call_id="call_9")
    divergence = compare_requests(body(), renamed)
    assert divergence is not None and divergence.field == "messages[3].tool_call_id"
    other_args = copy.deepcopy(body())
    other_args["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"command": "rm -rf /"}'
    divergence = compare_requests(body(), other_args)
    assert divergence is not None and divergence.field == "messages[2].tool_calls"
    assert "rm -rf" in divergence.diff


def test_message_count_is_checked_first() -> None:
    longer = body()
    longer["messages"] = [*longer["messages"], {"role": "user", "content": "more"}]
    divergence = compare_requests(body(), longer)
    assert divergence is not None
    assert (divergence.field, divergence.message_index) == ("message_count", 4)
    assert "4 messages" in divergence.summary and "5" in divergence.summary
    assert "+user: more" in divergence.diff
    shorter_and_changed = with_message(1, content="Something else")
    shorter_and_changed["messages"].pop()
    divergence = compare_requests(body(), shorter_and_changed)
    assert divergence is not None and divergence.message_index == 1
    assert "messages[1].content" in divergence.summary


def test_diff_is_at_most_forty_lines() -> None:
    recorded = with_message(3, content="\n".join(f"old {i}" for i in range(200)))
    live = with_message(3, content="\n".join(f"new {i}" for i in range(200)))
    divergence = compare_requests(recorded, live)
    assert divergence is not None
    lines = divergence.diff.splitlines()
    assert len(lines) == MAX_DIFF_LINES and lines[-1].startswith("... (") and "more lines" in lines[-1]


def test_missing_messages_compare_as_empty() -> None:
    assert compare_requests({}, {"messages": []}) is None
    divergence = compare_requests({}, body())
    assert divergence is not None and divergence.field == "message_count"
