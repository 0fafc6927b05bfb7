"""Cross-format live requests: the agent speaks one API, the live upstream another.

When ``upstream.api_format`` differs from the format of the agent's request, the proxy sends
the upstream the request translated into the upstream's format, and the agent the upstream's
answer translated back. Pairs (`supported_pairs`): all six. ``openai-chat`` ↔
``anthropic-messages`` (the field mapping is in `reroll_proxy.chat_anthropic`) and
``openai-responses`` ↔ ``openai-chat`` (`reroll_proxy.responses_chat`) have a hop of their own;
``openai-responses`` ↔ ``anthropic-messages`` go through Chat (`PIVOT`: two hops). An upstream
format with no route is refused with a `TranslationError`, as is a request with a part the
upstream's API cannot hold — except the parts a model can do without (`SHEDS`: Codex's built-in
tools, ``namespace`` tool groups, encrypted reasoning, unmapped fields such as ``include``), which
are dropped with a note recorded in the exchange's ``metadata.translation_notes``.

Streams are assembled, then re-emitted: the upstream's events are collected until its stream
ends, folded into one body by the upstream format (`WireFormat.assemble`), translated, and
split into the agent format's events (`WireFormat.to_events`). The agent's first byte waits for
the upstream's last one, but the events are always a well-formed stream of the agent's format
(each delta translated on the fly would need a state machine per pair for a small gain in
latency, and a live cross-format swap is a research tool, not a latency benchmark).

Errors (status >= 400) keep their status; their body is rewritten into the agent format's error
shape, with the upstream's ``error.type`` and ``error.message`` (both APIs nest them the same).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from reroll_contracts.errors import TranslationError, UntranslatableError
from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire import WireFormat, all_formats, format_named

from reroll_proxy import chat_anthropic, responses_chat
from reroll_proxy.respond import EventSource, parse_json

Body = dict[str, Any]


@dataclass(frozen=True)
class Translation:
    """How to talk to an upstream of another format than the agent's."""

    agent: WireFormat
    """The format the agent speaks (and receives)."""
    upstream: WireFormat
    """The format the upstream speaks."""
    _request: Callable[[Body], Body]
    _response: Callable[[Body], Body]
    _shed: Callable[[Body], tuple[Body, list[str]]] | None = None

    def request(self, body: Body) -> Body:
        """The agent's request `body` in the upstream's format.

        Raises:
            TranslationError: a part of `body` has no counterpart upstream.
        """
        return self.request_with_notes(body)[0]

    def request_with_notes(self, body: Body) -> tuple[Body, list[str]]:
        """The agent's request `body` in the upstream's format, after dropping what the upstream
        cannot hold but the model can do without (see `SHEDS`), and one note per part dropped
        (recorded as the exchange's ``metadata.translation_notes``).

        Raises:
            TranslationError: a part of `body` that cannot be dropped has no counterpart upstream.
        """
        body, notes = self._shed(body) if self._shed is not None else (body, [])
        try:
            return self._request(body), notes
        except UntranslatableError as exc:
            raise TranslationError(f"{self.agent.name} → {self.upstream.name}: {exc}") from exc

    def dropped(self, body: Body, headers: Mapping[str, str]) -> list[str]:
        """What the translation leaves out of the agent's request `body` (sent with `headers`),
        one note per kind; empty when nothing is known to be lost (see
        `reroll_proxy.chat_anthropic.messages_dropped`)."""
        if self.agent.name == "anthropic-messages":
            return chat_anthropic.messages_dropped(body, headers)
        return []

    def response_payload(self, status: int, payload: bytes) -> bytes:
        """The upstream's non-streamed response bytes, rewritten for the agent (see the module docstring)."""
        body = parse_json(payload)
        if status >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            error = error if isinstance(error, dict) else {}
            message = error.get("message") or (body if isinstance(body, str) else "upstream error")
            return self.agent.error_body(str(error.get("type") or "upstream_error"), str(message))
        if not isinstance(body, dict):
            return self.agent.error_body("upstream_error", f"upstream answered no JSON object: {body!r:.200}")
        return orjson.dumps(self._response(body))

    def events(self, upstream: EventSource, agent_request: Body) -> EventSource:
        """The agent's events for the upstream's stream `upstream` (assembled, then re-emitted)."""
        return _TranslatedEvents(self, upstream, agent_request)


class _TranslatedEvents(EventSource):
    def __init__(self, translation: Translation, upstream: EventSource, agent_request: Body) -> None:
        super().__init__()
        self._translation = translation
        self._upstream = upstream
        self._agent_request = agent_request

    async def batches(self) -> AsyncGenerator[list[SseEvent]]:
        received: list[SseEvent] = []
        async with contextlib.aclosing(self._upstream.batches()) as stream:
            async for batch in stream:
                received += batch
        self.error = self._upstream.error
        translation = self._translation
        body = translation._response(translation.upstream.assemble(received))
        yield translation.agent.to_events(body, self._agent_request)


Hop = tuple[Callable[[Body], Body], Callable[[Body], Body]]
"""(agent request → upstream request, upstream response → agent response) for one pair of formats."""
_HOPS: dict[tuple[str, str], Hop] = {
    ("openai-chat", "anthropic-messages"): (
        chat_anthropic.chat_to_messages,
        chat_anthropic.message_to_completion,
    ),
    ("anthropic-messages", "openai-chat"): (
        chat_anthropic.messages_to_chat,
        chat_anthropic.completion_to_message,
    ),
    ("openai-responses", "openai-chat"): (
        responses_chat.responses_to_chat,
        responses_chat.completion_to_response,
    ),
    ("openai-chat", "openai-responses"): (
        responses_chat.chat_to_responses,
        responses_chat.response_to_completion,
    ),
}
SHEDS: dict[tuple[str, str], Callable[[Body], tuple[Body, list[str]]]] = {
    ("openai-responses", "openai-chat"): responses_chat.shed_for_chat,
}
"""Per first hop, what is dropped (with a note) before translating rather than refused: the
parts of an agent's request a model can do without (Codex's built-in tools, encrypted reasoning)."""
PIVOT = "openai-chat"
"""Pairs without a hop of their own go through this format (Responses ↔ Chat ↔ Messages)."""


def _route(agent: str, upstream: str) -> list[Hop] | None:
    if (agent, upstream) in _HOPS:
        return [_HOPS[agent, upstream]]
    if (agent, PIVOT) in _HOPS and (PIVOT, upstream) in _HOPS:
        return [_HOPS[agent, PIVOT], _HOPS[PIVOT, upstream]]
    return None


def supported_pairs() -> list[tuple[str, str]]:
    """(agent format, upstream format) for every pair the proxy translates."""
    names = [wire.name for wire in all_formats()]
    return [(a, u) for a in names for u in names if a != u and _route(a, u) is not None]


def translation_for(agent: WireFormat, upstream_format: str | None) -> Translation | None:
    """The translation from `agent`'s format to `upstream_format`; None when no translation is needed.

    Args:
        agent: the format of the agent's request.
        upstream_format: the format the upstream speaks (None: the agent's).

    Raises:
        TranslationError: the pair is not supported (the message lists the supported ones).
    """
    if upstream_format is None or upstream_format == agent.name:
        return None
    hops = _route(agent.name, upstream_format)
    if hops is None:
        supported = ", ".join(f"{a} → {u}" for a, u in supported_pairs())
        raise TranslationError(
            f"cannot translate {agent.name} requests for an {upstream_format} upstream"
            f" (supported: {supported})"
        )

    def request(body: Body) -> Body:
        for forward, _ in hops:
            body = forward(body)
        return body

    def response(body: Body) -> Body:
        for _, backward in reversed(hops):
            body = backward(body)
        return body

    first = (agent.name, PIVOT if (agent.name, upstream_format) not in _HOPS else upstream_format)
    return Translation(agent, format_named(upstream_format), request, response, SHEDS.get(first))
