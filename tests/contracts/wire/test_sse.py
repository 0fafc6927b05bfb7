"""The SSE parser, encoder, assembler and splitter, fed by hand."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire.openai_chat import assemble_chat_completion, completion_to_events
from reroll_contracts.wire.sse import SseParser, encode_event


def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> SseEvent:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m", **extra}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    return SseEvent(data=json.dumps(body))


def test_parser_handles_events_split_anywhere() -> None:
    wire = b'data: {"a": 1}\n\nevent: ping\ndata: x\n\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(wire)):
        parser = SseParser()
        events = [e for start in range(0, len(wire), size) for e in parser.feed(wire[start : start + size])]
        events += parser.finish()
        assert events == [
            SseEvent(data='{"a": 1}'),
            SseEvent(event="ping", data="x"),
            SseEvent(data="[DONE]"),
        ]


def test_parser_line_ends_comments_multiline_data_and_utf8_split() -> None:
    wire = ": keep-alive\r\ndata: one\r\ndata:two\r\nid: 5\r\n\r\ndata: é\rdata: 🚀\r\r".encode()
    parser = SseParser()
    events = [e for byte in range(len(wire)) for e in parser.feed(wire[byte : byte + 1])]
    assert events == [SseEvent(data="one\ntwo")]  # the last "\r" may still become "\r\n"
    assert parser.finish() == [SseEvent(data="é\n🚀")]


_TEXT = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=12)


@given(
    events=st.lists(
        st.builds(
            SseEvent,
            event=st.none() | _TEXT.filter(lambda name: name != ""),
            data=st.lists(_TEXT, min_size=1, max_size=3).map("\n".join),
        ),
        max_size=5,
    ),
    line_end=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_parser_gives_the_events_whatever_the_line_ends_and_chunking(
    events: list[SseEvent], line_end: str, cuts: list[int]
) -> None:
    """Whole lines are split at once: chunks cut anywhere (in a "\r\n", in a UTF-8 character)
    and every line-end convention give the events encoded, in order."""
    wire = b"".join(encode_event(event) for event in events).replace(b"\n", line_end.encode())
    bounds = sorted({0, len(wire), *(cut for cut in cuts if cut < len(wire))})
    parser = SseParser()
    parsed = [event for start, end in itertools.pairwise(bounds) for event in parser.feed(wire[start:end])]
    assert [*parsed, *parser.finish()] == events


def test_parser_finish_flushes_an_unterminated_event() -> None:
    parser = SseParser()
    assert parser.feed(b"data: last") == []
    assert parser.finish() == [SseEvent(data="last")]
    assert parser.finish() == []


def test_encode_round_trips_through_the_parser() -> None:
    events = [SseEvent(data="a\nb"), SseEvent(event="error", data="{}"), SseEvent(data="[DONE]")]
    parser = SseParser()
    assert parser.feed(b"".join(encode_event(e) for e in events)) == events
    assert encode_event(SseEvent(data="x")) == b"data: x\n\n"


def test_assemble_merges_content_and_tool_calls_by_index() -> None:
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk(
            {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "bash"}}]}
        ),
        chunk({"tool_calls": [{"index": 1, "id": "call_b", "function": {"name": "edit", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"command":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "ls"}'}}]}),
        chunk({}, "tool_calls"),
        SseEvent(data=json.dumps({"id": "c1", "choices": [], "usage": {"total_tokens": 9}})),
        SseEvent(data="[DONE]"),
    ]
    completion = assemble_chat_completion(events)
    assert completion["object"] == "chat.completion"
    assert (completion["id"], completion["model"], completion["created"]) == ("c1", "m", 7)
    assert completion["usage"] == {"total_tokens": 9}
    (choice,) = completion["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            },
            {"id": "call_b", "type": "function", "function": {"name": "edit", "arguments": "{}"}},
        ],
    }


def test_assemble_without_content_gives_null_content() -> None:
    completion = assemble_chat_completion([chunk({"role": "assistant"}), chunk({}, "stop")])
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": None}


COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 3,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Some text that is long enough to split.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"c": 1}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}


@pytest.mark.parametrize("piece_chars", [1, 4, 1000])
def test_completion_to_events_round_trips(piece_chars: int) -> None:
    events = completion_to_events(COMPLETION, piece_chars=piece_chars, include_usage=True)
    assert events[-1].is_done
    chunks = [json.loads(e.data) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == COMPLETION["usage"]
    call_deltas = [c["choices"][0]["delta"].get("tool_calls") for c in chunks[:-1]]
    names = [calls[0]["function"].get("name") for calls in call_deltas if calls]
    assert names[0] == "bash" and set(names[1:]) <= {None}
    if piece_chars == 4:
        assert len(chunks) > 10
    assembled = assemble_chat_completion(events)
    assert assembled == COMPLETION


def test_completion_to_events_without_usage_chunk() -> None:
    events = completion_to_events(COMPLETION)
    assert all("usage" not in json.loads(e.data) for e in events[:-1])
    assert "usage" not in assemble_chat_completion(events)
