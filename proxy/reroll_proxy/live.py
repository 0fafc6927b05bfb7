"""Serving a step live: forward the agent's request to the `Upstream` (translated when the
upstream speaks another API format) and stream or send its answer back, recorded.

An upstream that cannot be reached, or whose non-streamed body breaks off, gives the agent a 502
(recorded, with ``metadata.error``); a stream that breaks off ends the events the agent gets, the
error in the exchange (`reroll_proxy.respond.UpstreamEvents`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from reroll_contracts.errors import TranslationError
from reroll_contracts.proxy import UpstreamConfig
from reroll_contracts.trajectory import sanitize_headers

from reroll_proxy.inject import Injector
from reroll_proxy.messages import StreamResponse
from reroll_proxy.respond import EventSource, ServedStep, UpstreamEvents, error_response, parse_json
from reroll_proxy.translate import translation_for
from reroll_proxy.upstream import Upstream, UpstreamError, UpstreamRequest

log = logging.getLogger("reroll_proxy")


async def serve_live(
    step: ServedStep, body: dict[str, Any], config: UpstreamConfig, upstream: Upstream
) -> StreamResponse:
    """Answer `step` from the live upstream (the exchange recorded before the agent sees its end).

    Args:
        step: the step being served.
        body: the agent's request body.
        config: the upstream's settings (URL, model swap, key, API format).
        upstream: where the request is sent.

    Returns:
        The response the agent gets (400 for a request with no counterpart in the upstream's
        format, 502 for an unreachable upstream).
    """
    sent = {**body, "model": config.model} if config.model else body
    try:
        translation = translation_for(step.wire, config.api_format)
        forwarded, step.translation_notes = (
            translation.request_with_notes(sent) if translation else (sent, [])
        )
    except TranslationError as exc:
        return error_response(step.wire, 400, "invalid_request_error", str(exc))
    upstream_wire = translation.upstream if translation else step.wire
    step.upstream_format = upstream_wire.name if translation else None
    if translation is not None:
        step.translation_notes += translation.dropped(sent, step.request.headers)
    url = config.base_url.rstrip("/") + upstream_wire.upstream_path
    if translation is None and step.request.query_string:
        url += "?" + step.request.query_string  # e.g. ?beta=true: the provider sees what the agent sent
    log.debug("step %d: live, %s model %s", step.number, url, sent.get("model"))
    faults = Injector(step)
    await faults.delay()
    headers = upstream_wire.upstream_headers(config.api_key, step.request.headers)
    request = UpstreamRequest(url, headers | {"Content-Type": "application/json"}, orjson.dumps(forwarded))
    asyncio.get_running_loop().call_soon(step.work_ahead, sent)  # once the request is on its way
    try:
        response = await upstream.send(request)
    except UpstreamError as exc:
        return await _unreachable(step, sent, f"upstream {url} unreachable: {exc}")
    async with response:
        headers = sanitize_headers(response.headers)
        if response.content_type == "text/event-stream":
            source: EventSource = UpstreamEvents(response)
            source = translation.events(source, sent) if translation else source
            source = faults.events(source)
            return await step.send_stream(response.status, headers, source, sent, sent.get("model"))
        try:
            payload = await response.read()
        except UpstreamError as exc:
            return await _unreachable(step, sent, f"upstream {url} broke off: {exc}")
    payload = translation.response_payload(response.status, payload) if translation else payload
    parsed = parse_json(payload)
    model = model_of(parsed) or sent.get("model")
    delivered = await step.send_json(response.status, headers, payload, sent, model, parsed=parsed)
    return await faults.deliver(delivered)


async def _unreachable(step: ServedStep, sent: dict[str, Any], error: str) -> StreamResponse:
    log.error("step %d: %s", step.number, error)
    payload = step.wire.error_body("upstream_error", error)
    return await step.send_json(502, {}, payload, sent, sent.get("model"), error=error)


def model_of(body: Any) -> str | None:
    """The ``model`` a response body names, or None."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None
