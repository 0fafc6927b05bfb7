"""Serving one step: write the response to the agent and record its exchange, in the order the
recorder's guarantee needs (see `reroll_proxy.recorder`).

`ServedStep` holds what is known about a request once the engine decided to serve it; its
`ServedStep.send_json` records and then answers, its `ServedStep.send_stream` forwards a stream
as it comes (a live one as the upstream's own bytes, parsed for the record after they are
written), holding back the stream's terminal event (``data: [DONE]``, ``message_stop``,
``response.completed``...: the API format says which) until the exchange is recorded. Replay
and live serving differ only in the `EventSource` they stream from.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from reroll_contracts.faults import FaultNote
from reroll_contracts.proxy import Divergence, FormatName
from reroll_contracts.trajectory import (
    Exchange,
    ExchangeMetadata,
    ExchangeRequest,
    ExchangeResponse,
    Place,
    RetryNote,
    Source,
    SseEvent,
    sanitize_headers,
)
from reroll_contracts.wire import WireFormat
from reroll_contracts.wire.sse import SseParser, encode_event

from reroll_proxy.engine import ReplayEngine
from reroll_proxy.messages import Request, Response, StreamResponse
from reroll_proxy.recorder import Recorder
from reroll_proxy.upstream import UpstreamError, UpstreamResponse

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_NOT_FORWARDED = frozenset(
    {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)


def error_response(wire: WireFormat, status: int, kind: str, message: str) -> Response:
    """An error response in `wire`'s shape (`WireFormat.error_body`)."""
    return Response(status=status, body=wire.error_body(kind, message), content_type="application/json")


def now_iso() -> str:
    """The current UTC time, ISO 8601."""
    return datetime.now(UTC).isoformat()


def parse_json(payload: bytes) -> Any:
    """The JSON value of `payload`, or its text when it is not JSON."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode("utf-8", errors="replace")


class EventSource:
    """Events to stream to the agent (here: a fixed list); `error` says why they ended early, if so.

    Events come in batches: each batch is written to the agent in one write, as soon as it is
    available, so nothing waits in a buffer but fewer writes are made.

    Args:
        events: the events, in order.
        offsets_ms: when each event was recorded, in milliseconds (parallel to `events`); None
            or a list of another length sends them without pauses.
        timing_factor: each event waits (its offset - the previous one's) x this factor, so 0
            sends every event at once (one batch) and 1 at the recorded pace (one event per
            batch); the first event is not delayed.
    """

    def __init__(
        self,
        events: Iterable[SseEvent] = (),
        offsets_ms: Sequence[float] | None = None,
        timing_factor: float = 0.0,
    ) -> None:
        self._events = list(events)
        paced = timing_factor > 0 and offsets_ms is not None and len(offsets_ms) == len(self._events)
        self._offsets = list(offsets_ms or []) if paced else []
        self._factor = timing_factor
        self.error: str | None = None

    def wire_chunks(self) -> AsyncGenerator[bytes] | None:
        """The upstream's own bytes of these events, as they arrive (the events are the ones
        `batches` would give), or None when the events are not the upstream's bytes (recorded,
        translated, faulted): then they are sent as `batches` gives them."""
        return None

    async def after_recorded(self, request: Request) -> bool:
        """Called once the exchange is recorded; True means the stream must not be finished
        (an injected fault broke it, see `reroll_proxy.inject`)."""
        return False

    async def batches(self) -> AsyncGenerator[list[SseEvent]]:
        """The events, in order, in batches (see the class docstring)."""
        if not self._offsets:
            yield self._events
            return
        for index, event in enumerate(self._events):
            if index:
                pause_ms = max(0.0, self._offsets[index] - self._offsets[index - 1]) * self._factor
                await asyncio.sleep(pause_ms / 1000)
            yield [event]


class UpstreamEvents(EventSource):
    """The events of an upstream ``text/event-stream`` response, parsed as its chunks arrive."""

    def __init__(self, response: UpstreamResponse) -> None:
        super().__init__()
        self._response = response

    async def batches(self) -> AsyncGenerator[list[SseEvent]]:
        """The events completed by each chunk received, as soon as it arrives; a broken stream
        ends them and sets `error`."""
        parser = SseParser()
        try:
            async for chunk in self._response.chunks():
                if events := parser.feed(chunk):
                    yield events
        except UpstreamError as exc:
            self.error = f"upstream stream broke off: {exc}"
        if events := parser.finish():
            yield events

    def wire_chunks(self) -> AsyncGenerator[bytes]:
        """The upstream's bytes as they arrive; a broken stream ends them and sets `error`."""
        return self._chunks()

    async def _chunks(self) -> AsyncGenerator[bytes]:
        try:
            async for chunk in self._response.chunks():
                yield chunk
        except UpstreamError as exc:
            self.error = f"upstream stream broke off: {exc}"


def peer_closed(request: Request) -> bool:
    """Whether the agent has closed its end of `request`'s connection (its FIN is waiting to be
    read: an HTTP/1.1 client sends nothing while it reads a response). One non-blocking peek."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return True
    raw = transport.get_extra_info("socket")
    if raw is None:
        return False
    sock = socket.socket(raw.family, raw.type, fileno=raw.fileno())  # a view of the agent's socket
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.detach()  # the transport's socket stays open


@dataclass
class ServedStep:
    """A request the engine decided to serve (replay or live), and what its exchange line needs."""

    number: int
    """The step (0-based)."""
    wire: WireFormat
    """The request's API format."""
    request: Request
    source: Source
    divergence: Divergence | None
    recorder: Recorder
    received: float
    """`time.monotonic` at receipt."""
    received_at: str
    """ISO 8601 time of receipt."""
    first_byte: float | None = None
    upstream_format: FormatName | None = None
    """The upstream's API when the proxy translated (recorded as ``metadata.upstream_format``)."""
    translation_notes: list[str] = field(default_factory=list)
    """What the translation dropped (recorded as ``metadata.translation_notes``)."""
    fault: FaultNote | None = None
    """The fault injected at this step, recorded as ``metadata.fault``."""
    thread: int | None = None
    """The request's thread (`reroll_proxy.threads`), recorded as ``metadata.thread``."""
    threads: ReplayEngine | None = None
    """Set when `thread` is not worked out yet: the engine whose ``thread_of`` gives it
    (``ReplayEngine.decide(..., later=True)``)."""
    replayed_from: int | None = None
    """The recorded exchange served (replayed steps), recorded as ``metadata.replayed_from``."""
    retry: RetryNote | None = None
    """Set when the request repeats an earlier attempt, recorded as ``metadata.retry``."""
    place: Place | None = None
    """Where in the trial the request was sent, recorded as ``metadata.place``."""
    _request_part: tuple[ExchangeRequest, bytes] | None = field(default=None, init=False, repr=False)
    """The exchange's request and its JSON (`ExchangeRequest.line_json`), once built (`_request_of`)."""

    def work_ahead(self, sent_body: Any) -> None:
        """Do now the recording work that does not wait for the response (the request's thread,
        the exchange's request and its JSON), e.g. while the upstream answers, so that it is off
        the response's path.

        Args:
            sent_body: the request body to record (as forwarded upstream); it must not change
                after this (its JSON is made now).
        """
        self._thread()
        self._request_of(sent_body)

    async def send_json(
        self,
        status: int,
        headers: dict[str, str],
        payload: bytes,
        sent_body: Any,
        model: str | None,
        error: str | None = None,
        parsed: Any = None,
    ) -> Response:
        """Record the exchange, then return the response that sends `payload` to the agent.

        Args:
            status: HTTP status for the agent (and the record).
            headers: upstream (or recorded) response headers, without secrets.
            payload: the body bytes, sent as they are.
            sent_body: the request body to record (as forwarded upstream).
            model: the model that produced the response.
            error: why the upstream failed, if it did.
            parsed: `payload` parsed already (`parse_json`), if the caller did; None: parsed here.
        """
        self.first_byte = time.monotonic()
        body = parse_json(payload) if parsed is None else parsed
        exchange = self._exchange(sent_body, status, headers, body, None, model, error)
        await self._record(exchange)
        content_type = headers.get("content-type", "application/json")
        return Response(status=status, body=payload, headers=self._agent_headers(headers, content_type))

    async def send_stream(
        self, status: int, headers: dict[str, str], source: EventSource, sent_body: Any, model: str | None
    ) -> StreamResponse:
        """Stream `source` to the agent as it comes; record before sending the terminal event.

        A source with the upstream's own bytes (`EventSource.wire_chunks`) has them forwarded as
        they arrive, each chunk before it is parsed for the record (`_forward_chunks`); any other
        is written one write per batch of events. Either way the terminal event is held back
        until the exchange is recorded.

        An agent that hangs up after it received some events gets an exchange of those events
        only, its ``metadata.error`` saying so (``the agent closed the connection after N of M
        events``); one that hangs up before the first event, none (it received nothing).

        Args:
            status: HTTP status for the agent (and the record).
            headers: upstream (or recorded) response headers, without secrets.
            source: the events to forward.
            sent_body: the request body to record (as forwarded upstream).
            model: the model that produced the response, unless the chunks name one.

        Raises:
            ConnectionResetError, asyncio.CancelledError: the agent hung up (after the recording).
        """
        response = StreamResponse(status=status, headers=self._agent_headers(headers, SSE_CONTENT_TYPE))
        await response.prepare(self.request)
        sent = _Delivery(self, response)
        try:
            chunks = source.wire_chunks()
            if chunks is not None:
                await self._forward_chunks(sent, chunks)
            else:
                async with contextlib.aclosing(source.batches()) as stream:
                    async for batch in stream:
                        await sent.send(batch)
        except (ConnectionResetError, asyncio.CancelledError):  # the agent hung up mid-stream
            if sent.delivered:  # it received part of a response: the trajectory says which part
                await asyncio.shield(self._record_aborted(sent_body, status, headers, model, sent))
            raise
        if peer_closed(self.request):  # it hung up; the writes went to its kernel, the end never
            await self._record_aborted(sent_body, status, headers, model, sent)
            return response
        exchange = self._stream_exchange(sent_body, status, headers, sent.events, model, source.error)
        exchange.response.event_offsets_ms = sent.offsets_ms
        await self._record(exchange)
        if await source.after_recorded(self.request):
            return response
        await response.write_eof(b"".join(map(encode_event, sent.held)))  # one write: the end, the last chunk
        return response

    async def _forward_chunks(self, sent: _Delivery, chunks: AsyncGenerator[bytes]) -> None:
        """Forward the upstream's bytes as they come, the events they complete parsed after.

        The bytes of complete events go out as they are, before being parsed, up to the first of
        the format's terminal markers (`WireFormat.terminal_markers`) in them, and as long as no
        ``\\r`` came; the bytes of an event still incomplete wait for the chunk that completes
        it. Bytes from a marker on are parsed first and still forwarded as they are when no event
        of theirs is terminal. From a terminal event (or a ``\\r``) on, the rest is parsed and
        sent as events, the terminal one held back (`_Delivery.send`). So when the whole stream
        comes in one piece, every event before the terminal one reaches the agent before any is
        parsed for the record.
        """
        parser = SseParser()
        markers = self.wire.terminal_markers
        pending = b""  # the bytes of the incomplete event the agent has not been sent yet
        as_is = True  # whether the upstream's bytes are still forwarded as they are
        async with contextlib.aclosing(chunks) as stream:
            async for chunk in stream:
                if not as_is:
                    await sent.send(parser.feed(chunk))
                    continue
                data = pending + chunk
                if b"\r" in data:  # line ends the events would not be cut at: parsed from here on
                    as_is = False
                    await sent.send(parser.feed(chunk))
                    continue
                cut = _first_marker(data, markers)
                marked = cut < len(data)
                end = data.rfind(b"\n\n", 0, cut) + 2  # the end of the last complete event before it
                if end > 1:  # whole events with no marker: out as they are, then parsed
                    await sent.forward(data[:end], None)
                    split = end - len(pending)  # where they end in `chunk`
                    sent.add(parser.feed(chunk[:split]))
                    chunk, data, pending = chunk[split:], data[end:], b""
                if not marked:  # what is left is an incomplete event
                    pending = data
                    sent.add(parser.feed(chunk))
                    continue
                events = parser.feed(chunk)
                if any(map(self.wire.is_terminal, events)):
                    as_is = False
                    await sent.send(events)
                    continue
                end = data.rfind(b"\n\n") + 2
                ready, pending = (data[:end], data[end:]) if end > 1 else (b"", data)
                await sent.forward(ready, events)
        await sent.send(parser.finish())

    async def _record_aborted(
        self,
        sent_body: Any,
        status: int,
        headers: dict[str, str],
        model: str | None,
        sent: _Delivery,
    ) -> None:
        """Record the events `sent` delivered: what the agent got before it hung up."""
        delivered, events = sent.delivered, sent.events
        error = f"the agent closed the connection after {delivered} of {len(events)} events"
        exchange = self._stream_exchange(sent_body, status, headers, events[:delivered], model, error)
        exchange.response.event_offsets_ms = sent.offsets_ms[:delivered]
        await self._record(exchange)

    def _stream_exchange(
        self,
        sent_body: Any,
        status: int,
        headers: dict[str, str],
        events: list[SseEvent],
        model: str | None,
        error: str | None,
    ) -> Exchange:
        """The exchange of a stream whose agent received `events`."""
        body = self.wire.assemble(events)
        return self._exchange(sent_body, status, headers, body, events, body.get("model") or model, error)

    def _agent_headers(self, headers: Mapping[str, str], content_type: str) -> dict[str, str]:
        kept = {name: value for name, value in headers.items() if name not in _NOT_FORWARDED}
        reroll = {"x-reroll-step": str(self.number), "x-reroll-source": self.source}
        return kept | reroll | {"content-type": content_type}

    async def _record(self, exchange: Exchange) -> None:
        """Record `exchange` (`Recorder.record`), with its request's JSON if it was made ahead."""
        part = self._request_part
        request_json = part[1] if part is not None and part[0] is exchange.request else None
        await self.recorder.record(self.number, exchange, request_json=request_json)

    def _request_of(self, sent_body: Any) -> ExchangeRequest:
        """The exchange's request, recording `sent_body` (built and serialised once per body)."""
        part = self._request_part
        if part is None or part[0].body is not sent_body:
            request = ExchangeRequest(
                timestamp=self.received_at,
                method=self.request.method,
                path=self.request.path_qs,  # the query too, e.g. Claude Code's ?beta=true
                headers=sanitize_headers(self.request.headers.items()),
                body=sent_body,
            )
            part = self._request_part = (request, request.line_json())
        return part[0]

    def _thread(self) -> int | None:
        """`thread`, asked of `threads` first if it is not worked out yet."""
        if self.threads is not None:
            self.thread, self.threads = self.threads.thread_of(self.number), None
        return self.thread

    def _exchange(
        self,
        sent_body: Any,
        status: int,
        headers: dict[str, str],
        body: Any,
        events: list[SseEvent] | None,
        model: str | None,
        error: str | None,
    ) -> Exchange:
        return Exchange(
            request=self._request_of(sent_body),
            response=ExchangeResponse(
                timestamp=now_iso(), status_code=status, headers=headers, body=body, events=events
            ),
            duration_ms=(time.monotonic() - self.received) * 1000,
            metadata=ExchangeMetadata(
                step=self.number,
                thread=self._thread(),
                place=self.place,
                replayed_from=self.replayed_from,
                source=self.source,
                api_format=self.wire.name,
                upstream_format=self.upstream_format,
                translation_notes=self.translation_notes,
                model=model,
                stream=events is not None,
                ttfb_ms=None if self.first_byte is None else (self.first_byte - self.received) * 1000,
                divergence=self.divergence,
                error=error,
                fault=self.fault,
                retry=self.retry,
            ),
        )


def _first_marker(data: bytes, markers: tuple[bytes, ...]) -> int:
    """Where the first of `markers` starts in `data`; ``len(data)`` when none is in it."""
    found = [at for marker in markers if (at := data.find(marker)) >= 0]
    return min(found) if found else len(data)


class _Delivery:
    """What a stream sent to the agent so far: every event received (with when), the terminal
    event and those after it held back, and how many events the agent was sent."""

    def __init__(self, step: ServedStep, response: StreamResponse) -> None:
        self._step = step
        self._response = response
        self.events: list[SseEvent] = []
        self.offsets_ms: list[float] = []
        self.held: list[SseEvent] = []
        """The terminal event and every event after it: sent once the exchange is recorded."""
        self.delivered = 0
        """How many of `events` were written to the agent."""

    def _received(self, events: list[SseEvent]) -> None:
        if events:
            offset_ms = round((time.monotonic() - self._step.received) * 1000, 3)
            self.events += events
            self.offsets_ms += [offset_ms] * len(events)

    async def _write(self, payload: bytes) -> None:
        await self._response.write(payload)
        if self._step.first_byte is None:
            self._step.first_byte = time.monotonic()

    def add(self, events: list[SseEvent]) -> None:
        """Note `events` as received now and already written to the agent (by `forward`)."""
        self._received(events)
        self.delivered = len(self.events) - len(self.held)

    async def forward(self, payload: bytes, events: list[SseEvent] | None) -> None:
        """Write `payload` (the upstream's bytes of whole events, none terminal) as it is; with
        `events` (its events, parsed already), note them as received and written."""
        if events is not None:
            self._received(events)
        if payload:
            await self._write(payload)
        if events is not None:
            self.delivered = len(self.events) - len(self.held)

    async def send(self, events: list[SseEvent]) -> None:
        """Note `events` as received now and write them in one write, holding back the terminal
        one and any after it."""
        ready: list[SseEvent] = []
        for event in events:
            (self.held if self.held or self._step.wire.is_terminal(event) else ready).append(event)
        self._received(events)
        if ready:
            await self._write(b"".join(map(encode_event, ready)))
            self.delivered = len(self.events) - len(self.held)
