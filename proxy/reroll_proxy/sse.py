"""Server-sent events for OpenAI Chat Completions streams (pure: no I/O).

- `SseParser` turns bytes, in chunks of any size, into `SseEvent` objects (the WHATWG
  event-stream rules: ``\\n``, ``\\r\\n`` or ``\\r`` line ends, ``:`` comments, multi-line
  ``data``; ``id`` and ``retry`` fields are ignored).
- `encode_event` is its inverse for one event.
- `assemble_chat_completion` folds ``chat.completion.chunk`` events into the
  ``chat.completion`` object a non-streamed request would have returned.
- `completion_to_events` goes the other way: it splits a ``chat.completion`` into chunk events
  ending in ``data: [DONE]``, the way OpenAI streams (text in pieces, tool-call name first,
  then its arguments in pieces).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

DONE = "[DONE]"
"""The data of the event that ends an OpenAI stream."""


class SseEvent(BaseModel):
    """One server-sent event."""

    model_config = ConfigDict(extra="allow", frozen=True)

    event: str | None = None
    """The ``event:`` field, or None when the event had none (OpenAI sends none)."""
    data: str
    """The ``data:`` lines joined with ``\\n``."""

    @property
    def is_done(self) -> bool:
        """Whether this is the ``data: [DONE]`` end-of-stream marker."""
        return self.data.strip() == DONE


class SseParser:
    """Incremental event-stream parser: feed it bytes as they arrive, get complete events."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse `chunk` (any size; may split lines, events or UTF-8 characters).

        Returns:
            The events completed by this chunk, in order.
        """
        self._buffer += chunk
        events: list[SseEvent] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, after = cut
            line = self._buffer[:end].decode("utf-8", errors="replace")
            self._buffer = self._buffer[after:]
            if event := self._take_line(line):
                events.append(event)

    def finish(self) -> list[SseEvent]:
        """End of stream: parse what is left (a last line or event without its terminator).

        Returns:
            The event still pending, if it had any data.
        """
        events = self.feed(b"\n") if self._buffer else []
        if self._data and (event := self._take_line("")):
            events.append(event)
        return events

    def _take_line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SseEvent | None:
        event = SseEvent(event=self._event, data="\n".join(self._data)) if self._data else None
        self._event, self._data = None, []
        return event


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Index of the first line end in `buffer` and of the byte after it; None if incomplete.

    A ``\\r`` as the very last byte is incomplete: it may be the start of ``\\r\\n``.
    """
    newline, carriage = buffer.find(b"\n"), buffer.find(b"\r")
    if carriage == -1 or (newline != -1 and newline < carriage):
        return None if newline == -1 else (newline, newline + 1)
    if carriage + 1 == len(buffer):
        return None
    return carriage, carriage + (2 if buffer[carriage + 1 : carriage + 2] == b"\n" else 1)


def encode_event(event: SseEvent) -> bytes:
    """The wire form of `event`: optional ``event:`` line, one ``data:`` line per data line, blank line."""
    head = f"event: {event.event}\n" if event.event is not None else ""
    lines = "".join(f"data: {line}\n" for line in event.data.split("\n"))
    return f"{head}{lines}\n".encode()


def assemble_chat_completion(events: Iterable[SseEvent]) -> dict[str, Any]:
    """Fold ``chat.completion.chunk`` events into one ``chat.completion`` object.

    String fields of each choice's ``delta`` (``content``, ``refusal``, ``reasoning_content``...)
    are concatenated; ``tool_calls`` are merged by their ``index`` (id, type and function name
    from the first delta that has them, ``arguments`` concatenated). Events whose data is not a
    JSON object (``[DONE]``, keep-alives) are skipped.

    Args:
        events: the stream's events, in order.

    Returns:
        ``{"id", "object": "chat.completion", "created", "model", "choices": [...], "usage"?,
        "system_fingerprint"?}``; choices are sorted by index, each with ``message`` and
        ``finish_reason``.
    """
    completion: dict[str, Any] = {"id": None, "object": "chat.completion", "created": None, "model": None}
    choices: dict[int, dict[str, Any]] = {}
    for chunk in _json_chunks(events):
        for key in ("id", "created", "model", "system_fingerprint"):
            if chunk.get(key) is not None and completion.get(key) is None:
                completion[key] = chunk[key]
        if chunk.get("usage") is not None:
            completion["usage"] = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            fresh = {"index": index, "message": {"role": "assistant"}, "tool_calls": {}}
            slot = choices.setdefault(index, fresh)
            _merge_delta(slot, choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                slot["finish_reason"] = choice["finish_reason"]
    completion["choices"] = [_finish_choice(choices[index]) for index in sorted(choices)]
    return completion


def _json_chunks(events: Iterable[SseEvent]) -> Iterable[dict[str, Any]]:
    for event in events:
        if event.is_done:
            continue
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict):
            yield chunk


def _merge_delta(slot: dict[str, Any], delta: dict[str, Any]) -> None:
    message = slot["message"]
    for key, value in delta.items():
        if key == "tool_calls":
            for call_delta in value or []:
                _merge_tool_call(slot["tool_calls"], call_delta)
        elif key == "role" and value:
            message["role"] = value
        elif isinstance(value, str):
            message[key] = message.get(key, "") + value
        elif value is not None and key not in message:
            message[key] = value


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    fresh = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    call = calls.setdefault(delta.get("index", len(calls)), fresh)
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


def _finish_choice(slot: dict[str, Any]) -> dict[str, Any]:
    message = slot["message"]
    message.setdefault("content", None)
    if slot["tool_calls"]:
        message["tool_calls"] = [slot["tool_calls"][index] for index in sorted(slot["tool_calls"])]
    return {"index": slot["index"], "message": message, "finish_reason": slot.get("finish_reason")}


def completion_to_events(
    completion: dict[str, Any], *, piece_chars: int = 16, include_usage: bool = False
) -> list[SseEvent]:
    """Split a ``chat.completion`` object into the chunk events that would have streamed it.

    Args:
        completion: a ``chat.completion`` object (e.g. a recorded non-streamed response).
        piece_chars: characters of text or tool-call arguments per chunk (>= 1).
        include_usage: add the final usage chunk (empty ``choices``), as OpenAI does when the
            request sets ``stream_options.include_usage``; only if `completion` has ``usage``.

    Returns:
        The events, ending with ``data: [DONE]``; `assemble_chat_completion` folds them back.
    """
    head: dict[str, Any] = {key: completion[key] for key in ("id", "created", "model") if key in completion}
    head["object"] = "chat.completion.chunk"
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]
    chunks: list[dict[str, Any]] = []
    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        deltas = _choice_deltas(choice.get("message") or {}, max(1, piece_chars))
        chunks += [{"index": index, "delta": delta, "finish_reason": None} for delta in deltas]
        chunks.append({"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")})
    events = [_chunk_event({**head, "choices": [choice]}) for choice in chunks]
    if include_usage and completion.get("usage") is not None:
        events.append(_chunk_event({**head, "choices": [], "usage": completion["usage"]}))
    return [*events, SseEvent(data=DONE)]


def _choice_deltas(message: dict[str, Any], piece_chars: int) -> list[dict[str, Any]]:
    content = message.get("content")
    deltas: list[dict[str, Any]] = [
        {"role": message.get("role", "assistant"), "content": "" if isinstance(content, str) else None}
    ]
    for key, value in message.items():
        if key not in ("role", "tool_calls") and isinstance(value, str):
            deltas += [{key: piece} for piece in _pieces(value, piece_chars)]
    for position, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": position,
                        "id": call.get("id"),
                        "type": call.get("type", "function"),
                        "function": {"name": function.get("name", ""), "arguments": ""},
                    }
                ]
            }
        )
        deltas += [
            {"tool_calls": [{"index": position, "function": {"arguments": piece}}]}
            for piece in _pieces(function.get("arguments") or "", piece_chars)
        ]
    return deltas


def _pieces(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def _chunk_event(chunk: dict[str, Any]) -> SseEvent:
    return SseEvent(data=orjson.dumps(chunk).decode())
