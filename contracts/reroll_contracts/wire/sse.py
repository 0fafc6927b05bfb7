"""Server-sent events, the wire form of every streamed API response (pure: no I/O).

- `SseParser` turns bytes, in chunks of any size, into `SseEvent` objects
  (`reroll_contracts.trajectory`: they are recorded in exchange lines; the WHATWG
  event-stream rules: ``\\n``, ``\\r\\n`` or ``\\r`` line ends, ``:`` comments, multi-line
  ``data``; ``id`` and ``retry`` fields are ignored).
- `encode_event` is its inverse for one event.
- `json_payloads` and `pieces` help the per-format modules (`reroll_contracts.wire`) fold
  events into a body and split a body into events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from reroll_contracts.trajectory import SseEvent


class SseParser:
    """Incremental event-stream parser: feed it bytes as they arrive, get complete events.

    Each chunk's complete lines are decoded and split at once (line ends normalised to ``\\n``
    first when the chunk has a ``\\r``), so the cost per event is a few string operations.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Parse `chunk` (any size; may split lines, events or UTF-8 characters).

        Returns:
            The events completed by this chunk, in order.
        """
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            # A last "\r" may be the first half of "\r\n": it waits for the next chunk.
            held = b"\r" if buffer.endswith(b"\r") else b""
            buffer = buffer[: len(buffer) - len(held)].replace(b"\r\n", b"\n").replace(b"\r", b"\n") + held
        end = buffer.rfind(b"\n") + 1
        if not end:
            self._buffer = buffer
            return []
        self._buffer = buffer[end:]
        events: list[SseEvent] = []
        name, data = self._event, self._data
        # A UTF-8 character never contains the byte "\n": the complete lines decode on their own.
        # Cut at the blank lines: a block that is one "data: " line (most of them) is an event as
        # it is; any other goes through its fields line by line (`_take_lines`).
        *blocks, rest = buffer[:end].decode("utf-8", errors="replace").split("\n\n")
        for block in blocks:
            if name is None and not data and block[:6] == "data: " and "\n" not in block:
                events.append(SseEvent(data=block[6:]))
                continue
            name, data = _take_lines(block.split("\n"), name, data, events)
            if data:  # the blank line that ended the block dispatches its event
                events.append(SseEvent(event=name, data="\n".join(data)))
            name, data = None, []
        if rest:  # complete lines of an event still incomplete, each "\n"-terminated
            name, data = _take_lines(rest[:-1].split("\n"), name, data, events)
        self._event, self._data = name, data
        return events

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
        if line[0] == ":":
            return None
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> SseEvent | None:
        event = SseEvent(event=self._event, data="\n".join(self._data)) if self._data else None
        self._event, self._data = None, []
        return event


def _take_lines(
    lines: list[str], name: str | None, data: list[str], events: list[SseEvent]
) -> tuple[str | None, list[str]]:
    """Take `lines` (no line ends) into the event being built (`name`, `data`), appending the
    events their blank lines dispatch to `events`; returns the event being built after them."""
    for line in lines:
        if not line:  # a blank line dispatches the event, if it has data
            if data:
                events.append(SseEvent(event=name, data="\n".join(data)))
            name, data = None, []
        elif line[0] != ":":
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                name = value
    return name, data


def encode_event(event: SseEvent) -> bytes:
    """The wire form of `event`: optional ``event:`` line, one ``data:`` line per data line, blank line."""
    data = event.data
    lines = f"data: {data}\n" if "\n" not in data else "".join(f"data: {line}\n" for line in data.split("\n"))
    if event.event is None:
        return f"{lines}\n".encode()
    return f"event: {event.event}\n{lines}\n".encode()


def json_payloads(events: Iterable[SseEvent]) -> Iterable[dict[str, Any]]:
    """The data of each event that is a JSON object, in order (``[DONE]``, keep-alives skipped:
    neither is JSON)."""
    loads, not_json = orjson.loads, orjson.JSONDecodeError
    for event in events:
        try:
            payload = loads(event.data)
        except not_json:
            continue
        if isinstance(payload, dict):
            yield payload


def pieces(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters (>= 1); none for an empty text."""
    size = max(1, size)
    return [text[start : start + size] for start in range(0, len(text), size)]
