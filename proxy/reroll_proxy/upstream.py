"""The seam between the proxy and the model provider: an `Upstream` sends one request and gives
back its response, whole or chunk by chunk (in the spirit of httpx's transports).

- `Http1Upstream` (`reroll_proxy.http1`) — the real one: HTTP/1.1 over keep-alive connections
  on the event loop's own transports, its errors `UpstreamError` at this boundary.
- `InMemoryUpstream` — its twin for tests: answers each request from the responses it was given
  (in order) or from a function, and keeps every request it received; no socket.

The proxy builds the request (URL, provider headers, the JSON body as bytes) and reads the
response; neither side knows which upstream it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from reroll_contracts.errors import UpstreamError

from reroll_proxy.http1 import Http1Upstream

__all__ = [
    "CannedResponse",
    "Http1Upstream",
    "InMemoryUpstream",
    "Upstream",
    "UpstreamError",
    "UpstreamRequest",
    "UpstreamResponse",
]


@dataclass(frozen=True)
class UpstreamRequest:
    """One ``POST`` to the provider."""

    url: str
    """The whole URL, query included (``https://api.anthropic.com/v1/messages?beta=true``)."""
    headers: Mapping[str, str]
    """The headers sent, credentials included (never recorded)."""
    body: bytes
    """The JSON body, as sent."""


class UpstreamResponse(Protocol):
    """A response whose head arrived; its body is read once, whole (`read`) or by chunks (`chunks`).

    Use it as an async context manager: leaving it releases the connection.
    """

    @property
    def status(self) -> int:
        """The HTTP status."""

    @property
    def headers(self) -> Iterable[tuple[str, str]]:
        """The response headers as (name, value) pairs, in order."""

    @property
    def content_type(self) -> str:
        """The media type without parameters (``text/event-stream``, ``application/json``)."""

    async def read(self) -> bytes:
        """The whole body.

        Raises:
            UpstreamError: the body broke off.
        """

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, in chunks of any size.

        Raises:
            UpstreamError: the body broke off (after the chunks that did arrive).
        """

    async def __aenter__(self) -> UpstreamResponse: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class Upstream(Protocol):
    """Sends requests to the model provider (one per rollout; may serve requests concurrently)."""

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send `request`; return once the response's head arrived.

        Raises:
            UpstreamError: no connection, or no answer within the upstream's timeout.
        """

    async def aclose(self) -> None:
        """Release its connections; no `send` after this."""


@dataclass
class CannedResponse:
    """A response `InMemoryUpstream` gives: `body` whole, or `chunks` one at a time (a stream)."""

    status: int = 200
    body: bytes = b""
    """The body (ignored when `chunks` is set)."""
    content_type: str = "application/json"
    """The media type; ``text/event-stream`` for a stream of SSE events."""
    headers: list[tuple[str, str]] = field(default_factory=list)
    """Headers besides ``content-type`` (which is added from `content_type`)."""
    chunks: list[bytes] | None = None
    """The body in the chunks a stream delivers them, in order."""
    broken_after: int | None = None
    """Raise `UpstreamError` after this many chunks (a stream that broke off); None: it ends."""


Answer = CannedResponse | UpstreamError
"""What `InMemoryUpstream` answers one request with: a response, or an error `send` raises."""


class _CannedStream:
    """An `UpstreamResponse` over a `CannedResponse`."""

    def __init__(self, canned: CannedResponse) -> None:
        self._canned = canned

    @property
    def status(self) -> int:
        return self._canned.status

    @property
    def headers(self) -> Iterable[tuple[str, str]]:
        return [("content-type", self._canned.content_type), *self._canned.headers]

    @property
    def content_type(self) -> str:
        return self._canned.content_type

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        canned = self._canned
        pieces = canned.chunks if canned.chunks is not None else [canned.body]
        for index, chunk in enumerate(pieces):
            if index == canned.broken_after:
                raise UpstreamError("the in-memory stream broke off")
            await asyncio.sleep(0)  # a chunk at a time, as from a socket
            yield chunk
        if canned.broken_after is not None and canned.broken_after >= len(pieces):
            raise UpstreamError("the in-memory stream broke off")

    async def __aenter__(self) -> _CannedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None


class InMemoryUpstream:
    """An `Upstream` that answers from what it was given, without a socket (the test twin).

    Args:
        answers: the answers to the requests, in order (a `CannedResponse`, or an `UpstreamError`
            to raise); a request past the last is answered 500 ``in-memory upstream exhausted``.
        handler: instead of `answers`, called with each request for its answer.

    Attributes:
        requests: every request received, in order.
    """

    def __init__(
        self,
        answers: Iterable[Answer] = (),
        handler: Callable[[UpstreamRequest], Awaitable[Answer]] | None = None,
    ) -> None:
        self._answers = list(answers)
        self._handler = handler
        self.requests: list[UpstreamRequest] = []
        self.closed = False

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """See `Upstream.send`."""
        self.requests.append(request)
        if self._handler is not None:
            answer = await self._handler(request)
        elif self._answers:
            answer = self._answers.pop(0)
        else:
            answer = CannedResponse(500, b'{"error": {"message": "in-memory upstream exhausted"}}')
        if isinstance(answer, UpstreamError):
            raise answer
        return _CannedStream(answer)

    async def aclose(self) -> None:
        """See `Upstream.aclose`."""
        self.closed = True
