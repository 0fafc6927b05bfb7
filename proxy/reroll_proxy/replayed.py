"""Serving a step from the recording: the recorded response, re-sent as it was.

A streamed request gets the recorded SSE events re-emitted in order, one write each, paced by
``replay_timing_factor`` (a non-streamed recording is turned into events by its format); a
non-streamed one the recorded body; a recorded error status is served as it was. A replayed line
that records a fault reproduces it (`reroll_proxy.inject`); when a fault of the plan broke the
response, the engine serves the same recorded exchange to the agent's retry.
"""

from __future__ import annotations

import logging
from typing import Any

from reroll_contracts.faults import ResetFault

from reroll_proxy.engine import Replay, ReplayEngine
from reroll_proxy.inject import Injector, recorded_payload, serve_in_place
from reroll_proxy.live import model_of
from reroll_proxy.messages import StreamResponse
from reroll_proxy.respond import EventSource, ServedStep

log = logging.getLogger("reroll_proxy")


async def serve_replayed(
    step: ServedStep, body: dict[str, Any], replay: Replay, engine: ReplayEngine, timing_factor: float
) -> StreamResponse:
    """Answer `step` with the recorded exchange the engine chose (recorded before the agent sees its end).

    Args:
        step: the step being served.
        body: the agent's request body.
        replay: the engine's decision, with the recorded exchange.
        engine: told to serve the exchange again when a fault of the plan broke it.
        timing_factor: pacing of the recorded events (`ProxyConfig.replay_timing_factor`).
    """
    recorded = replay.exchange.response
    model = replay.exchange.metadata.model or model_of(recorded.body)
    log.debug("step %d: replayed", step.number)
    factor = 1.0
    if step.fault is None and (recorded_fault := replay.exchange.metadata.fault) is not None:
        step.fault = recorded_fault.model_copy(update={"replayed": True})
        factor = timing_factor
        if isinstance(recorded_fault.spec, ResetFault):
            return await serve_in_place(step, step.fault, body)
    faults = Injector(step, factor)
    try:
        await faults.delay()
        status, headers = recorded.status_code, recorded.headers
        if body.get("stream") is True and status < 400 and not isinstance(recorded.body, str):
            events, offsets = recorded.events, recorded.event_offsets_ms
            if events is None:
                events = step.wire.to_events(recorded.body if isinstance(recorded.body, dict) else {}, body)
            source = faults.events(EventSource(events, offsets, timing_factor))
            return await step.send_stream(status, headers, source, body, model)
        payload = recorded_payload(recorded.body)
        return await faults.deliver(await step.send_json(status, headers, payload, body, model))
    finally:
        if faults.broken and step.fault is not None and not step.fault.replayed:
            engine.serve_again(replay)  # a plan's fault broke it: the agent's retry gets it again
