"""Applying a chosen fault (`reroll_proxy.faults`) to the step being served.

- In place of the model (`serve_in_place`): ``status``, ``reset``, ``malformed`` — recorded,
  then answered; a reset is recorded with ``status_code`` 0 and ``metadata.error``, then the
  connection is closed with a TCP RST.
- Around the served response (`Injector`): ``latency``, ``stall`` and ``cut``. A stream is
  stalled or cut after ``after_events`` events (`FaultedEvents`): the events sent before a cut or
  an endless stall are recorded (with ``metadata.error``) before the connection is dropped or
  left hanging. A non-streamed response is recorded whole, then its headers and the first half
  of its body are sent before the connection is dropped, left hanging, or resumed.

A replayed exchange line that carries ``metadata.fault`` is served the same way: the recorded
fault is reproduced in place, so a replay shows the agent what it saw.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import AsyncGenerator
from typing import Any

import orjson
from reroll_contracts.faults import CutFault, FaultNote, LatencyFault, MalformedFault, StallFault, StatusFault
from reroll_contracts.trajectory import SseEvent

from reroll_proxy.faults import MALFORMED_BODY, status_response
from reroll_proxy.messages import Request, Response, StreamResponse
from reroll_proxy.respond import EventSource, ServedStep

log = logging.getLogger("reroll_proxy")


class FaultedEvents(EventSource):
    """`inner`'s events, stalled or cut after ``fault.after_events`` of them.

    Args:
        inner: the events to serve.
        fault: a stall (pause ``seconds`` x `timing_factor`, or forever) or a cut.
        timing_factor: scales a finite stall (1 live; the replay timing factor in replay).
    """

    def __init__(self, inner: EventSource, fault: StallFault | CutFault, timing_factor: float = 1.0) -> None:
        super().__init__()
        self._inner = inner
        self._fault = fault
        self._factor = timing_factor
        self._broken = False

    async def batches(self) -> AsyncGenerator[list[SseEvent]]:
        """The inner batches, split at the fault's event; ends there on a cut or an endless stall."""
        sent, limit, pending = 0, self._fault.after_events, True
        stall = self._fault.seconds if isinstance(self._fault, StallFault) else None
        async for batch in self._inner.batches():
            if not pending or sent + len(batch) < limit:
                sent += len(batch)
                yield batch
                continue
            head, tail = batch[: limit - sent], batch[limit - sent :]
            if head:
                yield head
            if stall is None:
                self._broken = True
                self.error = f"fault: stream {self._fault.kind} after {limit} events"
                return
            await asyncio.sleep(stall * self._factor)
            sent, pending = sent + len(batch), False
            if tail:
                yield tail
        self.error = self._inner.error

    @property
    def broken(self) -> bool:
        """Whether the fault cut the stream short (a cut, or an endless stall)."""
        return self._broken

    async def after_recorded(self, request: Request) -> bool:
        """Drop the connection (cut) or hang until the client gives up (endless stall)."""
        if not self._broken:
            return False
        if isinstance(self._fault, CutFault):
            _reset(request)
            return True
        await asyncio.Event().wait()  # until the client hangs up (the handler is cancelled)
        return True  # pragma: no cover - never reached


class Injector:
    """The fault of one served step (`ServedStep.fault`), applied around its response.

    Args:
        step: the step; nothing is done unless its fault is a latency, a stall or a cut.
        timing_factor: scales the latency and a finite stall (1 for a plan's faults; the replay
            timing factor when a recorded fault is reproduced).
    """

    def __init__(self, step: ServedStep, timing_factor: float = 1.0) -> None:
        self._step = step
        self._spec = step.fault.spec if step.fault is not None else None
        self._factor = timing_factor
        self._events: FaultedEvents | None = None
        self._broken = False

    @property
    def broken(self) -> bool:
        """Whether the response was not delivered whole (a cut, or an endless stall)."""
        return self._broken or (self._events is not None and self._events.broken)

    async def delay(self) -> None:
        """Wait out a ``latency`` fault."""
        if isinstance(self._spec, LatencyFault):
            log.warning("step %d: fault: latency %g s", self._step.number, self._spec.seconds)
            await asyncio.sleep(self._spec.seconds * self._factor)

    def events(self, source: EventSource) -> EventSource:
        """`source`, stalled or cut by a ``stall`` / ``cut`` fault."""
        if isinstance(self._spec, StallFault | CutFault):
            log.warning(
                "step %d: fault: stream %s after %d events",
                self._step.number,
                self._spec.kind,
                self._spec.after_events,
            )
            self._events = FaultedEvents(source, self._spec, self._factor)
            return self._events
        return source

    async def deliver(self, response: Response) -> StreamResponse:
        """`response` (already recorded), or, under a ``stall`` / ``cut`` fault, its headers and
        the first half of its body, then the connection dropped, a pause, or an endless stall."""
        if not isinstance(self._spec, StallFault | CutFault):
            return response
        request, body = self._step.request, response.body
        log.warning(
            "step %d: fault: body %s after %d of %d bytes",
            self._step.number,
            self._spec.kind,
            len(body) // 2,
            len(body),
        )
        partial = StreamResponse(status=response.status, headers=response.headers)
        partial.content_length = len(body)
        await partial.prepare(request)
        await partial.write(body[: len(body) // 2])
        pause = self._spec.seconds if isinstance(self._spec, StallFault) else None
        if pause is None:
            self._broken = True
            if isinstance(self._spec, CutFault):
                _reset(request)
            else:
                await asyncio.Event().wait()  # until the client hangs up (the handler is cancelled)
            return partial
        await asyncio.sleep(pause * self._factor)
        await partial.write(body[len(body) // 2 :])
        await partial.write_eof()
        return partial


async def serve_in_place(step: ServedStep, note: FaultNote, body: dict[str, Any]) -> StreamResponse:
    """Record and answer a ``status``, ``reset`` or ``malformed`` fault for `step`.

    Args:
        step: the step (its `ServedStep.fault` is set to `note`).
        note: the fault.
        body: the request body (recorded as sent).
    """
    step.fault = note
    spec = note.spec
    if isinstance(spec, StatusFault):
        status, headers, payload = status_response(step.wire, spec)
        return await step.send_json(status, headers, payload, body, None)
    if isinstance(spec, MalformedFault):
        if body.get("stream") is True:
            return await step.send_json(
                200, {"content-type": "text/event-stream"}, b"data: " + MALFORMED_BODY + b"\n\n", body, None
            )
        return await step.send_json(200, {"content-type": "application/json"}, MALFORMED_BODY, body, None)
    await step.send_json(0, {}, b"", body, None, error="fault: connection reset, no response")
    _reset(step.request)
    return Response()  # never sent: the connection is gone


def recorded_payload(body: Any) -> bytes:
    """The bytes a recorded body was sent as: text as it was (a malformed body), JSON otherwise."""
    return body.encode() if isinstance(body, str) else orjson.dumps(body)


def _reset(request: Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
