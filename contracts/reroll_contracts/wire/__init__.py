"""The provider API formats, one small module per format behind `WireFormat` (pure: no I/O).

The proxy speaks them; the controller's run-folder readers, viewers and exporters read recorded
bodies through them, and the scripted model server answers in them.

============================  ======================================  ===================
name                          agent-facing paths                      upstream path
============================  ======================================  ===================
``openai-chat``               ``/v1/chat/completions``                ``/chat/completions``
``openai-responses``          ``/v1/responses``                       ``/responses``
``anthropic-messages``        ``/v1/messages``                        ``/messages``
============================  ======================================  ===================

(each path also without the ``/v1`` prefix). The record / replay / cutover engine never looks
inside a body: what differs between formats (SSE assembly, errors, auth, normalisation for the
divergence check, the answer in a common shape for exports) is asked of the request's `WireFormat`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from reroll_contracts.proxy import FormatName
from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire.normal import NormalRequest, NormalResponse


class WireFormat(Protocol):
    """What the proxy needs to know about one provider API."""

    @property
    def name(self) -> FormatName:
        """Recorded as ``metadata.api_format``."""
        ...

    @property
    def paths(self) -> tuple[str, ...]:
        """The agent-facing URL paths."""
        ...

    @property
    def upstream_path(self) -> str:
        """Appended to the upstream ``base_url`` (which ends in ``/v1``)."""
        ...

    @property
    def conversation_key(self) -> str:
        """The body field holding the conversation's list (``messages``, ``input``): `normalise`
        gives one normal message per entry, after what other fields add first (a system prompt)."""
        ...

    def upstream_headers(self, api_key: str | None, agent_headers: Mapping[str, str]) -> dict[str, str]:
        """The headers of a request to the upstream: its credentials, and what the API needs."""
        ...

    def error_body(self, kind: str, message: str) -> bytes:
        """An error body in this API's shape (`kind` e.g. ``invalid_request_error``)."""
        ...

    def is_terminal(self, event: SseEvent) -> bool:
        """Whether `event` ends the stream (held back until the exchange is recorded)."""
        ...

    @property
    def terminal_markers(self) -> tuple[bytes, ...]:
        """Byte strings one of which the wire form of every terminal event (`is_terminal`)
        contains: bytes that contain none of them hold no terminal event (the proxy forwards
        them before parsing them)."""
        ...

    def assemble(self, events: Iterable[SseEvent]) -> dict[str, Any]:
        """The body a non-streamed request would have returned, folded from a stream's events."""
        ...

    def to_events(
        self, body: dict[str, Any], request: dict[str, Any], piece_chars: int = 16
    ) -> list[SseEvent]:
        """The events that stream `body` (answering `request`); `assemble` folds them back.

        Args:
            body: a non-streamed response body.
            request: the request it answers (some options shape the stream).
            piece_chars: characters of text or arguments per delta event (>= 1).
        """
        ...

    def normalise(self, body: dict[str, Any]) -> NormalRequest:
        """The request `body` in the common shape (`reroll_contracts.wire.normal`)."""
        ...

    def normalise_response(self, body: dict[str, Any]) -> NormalResponse:
        """The assistant message of a successful response `body` (non-streamed, or assembled
        from the events) in the common shape, verbatim, with tool-call ids and usage."""
        ...


@functools.cache
def all_formats() -> tuple[WireFormat, ...]:
    """Every format, Chat Completions first."""
    from reroll_contracts.wire import anthropic_messages, openai_chat, openai_responses

    return (openai_chat.FORMAT, openai_responses.FORMAT, anthropic_messages.FORMAT)


def format_named(name: str) -> WireFormat:
    """The format called `name`.

    Raises:
        KeyError: no format has that name (the message lists the names).
    """
    for wire in all_formats():
        if wire.name == name:
            return wire
    names = ", ".join(wire.name for wire in all_formats())
    raise KeyError(f"unknown API format {name!r} (known: {names})")


def format_for_path(path: str) -> WireFormat | None:
    """The format serving the agent-facing URL `path` (a query, as in ``?beta=true``, ignored), or None."""
    path = path.partition("?")[0]
    for wire in all_formats():
        if path in wire.paths:
            return wire
    return None
