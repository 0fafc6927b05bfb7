"""The requests and responses of the proxy's HTTP/1.1 server (`reroll_proxy.front`).

A handler takes a `Request` (its head parsed, its body read whole before the handler runs) and
returns a `Response` (the server writes its head and body in one write once the handler returns),
or a `StreamResponse` it wrote itself: `StreamResponse.prepare` sends the head (the body framed
chunked, or as it is when ``content_length`` is set), `StreamResponse.write` each piece as it
comes (waiting while the agent's socket is full), `StreamResponse.write_eof` the end. Names
follow aiohttp's (``path_qs``, ``query_string``, ``match_info``...), whose server this replaced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson
from multidict import CIMultiDict

if TYPE_CHECKING:
    from reroll_proxy.front import Connection

_REASONS = {status.value: status.phrase for status in HTTPStatus}


class Request:
    """One request of a connection: its head, and its body once `read`.

    Attributes:
        method: ``GET``, ``POST``...
        path: the target's path, as sent (not percent-decoded).
        query_string: the target's query, without ``?`` (``""`` when none).
        headers: case-insensitive, values decoded as latin-1.
        match_info: the route's ``{name}`` segments (`reroll_proxy.front.Router`).
        keep_alive: whether the client lets the connection serve another request after this one.
        http10: whether the client speaks HTTP/1.0 (its response is not chunked).
    """

    __slots__ = (
        "_body",
        "_connection",
        "_done",
        "_error",
        "_waiter",
        "headers",
        "http10",
        "keep_alive",
        "match_info",
        "method",
        "path",
        "query_string",
        "size",
        "too_large",
    )

    def __init__(
        self,
        connection: Connection,
        method: str,
        target: str,
        headers: CIMultiDict[str],
        keep_alive: bool,
        http10: bool,
    ) -> None:
        self._connection = connection
        self.method = method
        path, _, self.query_string = target.partition("?")
        self.path = path.partition("#")[0]
        self.headers = headers
        self.keep_alive = keep_alive
        self.http10 = http10
        self.match_info: dict[str, str] = {}
        self._body: list[bytes] = []
        self.size = 0
        """Body bytes received so far."""
        self.too_large = False
        """Whether the body exceeded the server's limit (its bytes are dropped)."""
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        """Made only when the handler waits for a body still on its way."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport; None once it is closed."""
        return self._connection.transport

    @property
    def sockname(self) -> tuple[str, int] | None:
        """The (host, port) the connection arrived at (the listening site's)."""
        return self._connection.sockname

    @property
    def path_qs(self) -> str:
        """The path and the query (``/v1/messages?beta=true``)."""
        return f"{self.path}?{self.query_string}" if self.query_string else self.path

    @property
    def query(self) -> dict[str, str]:
        """The query's parameters (the last of a repeated name)."""
        return dict(parse_qsl(self.query_string, keep_blank_values=True))

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived (or never will)."""
        return self._done

    async def read(self) -> bytes:
        """The whole body (waits for it).

        Raises:
            ConnectionResetError: the client closed the connection before sending all of it.
        """
        await self.wait_body()
        if len(self._body) > 1:
            self._body[:] = [b"".join(self._body)]
        return self._body[0] if self._body else b""

    async def wait_body(self) -> None:
        """Wait until the whole body has arrived (raises as `read`)."""
        if not self._done:
            if self._waiter is None:
                self._waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._waiter)
        if self._error is not None:
            raise self._error

    def feed(self, data: bytes, limit: int) -> None:
        """Add body bytes; past `limit` bytes in all, they are dropped and `too_large` set."""
        self.size += len(data)
        if self.size > limit:
            self.too_large = True
            self._body.clear()
        else:
            self._body.append(data)

    def finish(self, error: BaseException | None = None) -> None:
        """The body is whole (or, with `error`, will never be)."""
        if self._done:
            return
        self._done, self._error = True, error
        if self._waiter is not None:
            self._waiter.set_result(None)


class StreamResponse:
    """A response the handler writes itself (see the module docstring).

    Args:
        status: the HTTP status.
        headers: its header fields (``Content-Length`` and ``Transfer-Encoding`` are the server's).
    """

    def __init__(self, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.headers: dict[str, str] = dict(headers) if headers else {}
        self.content_length: int | None = None
        """Set before `prepare`: the body is that many bytes, sent as they are (not chunked)."""
        self.keep_alive = True
        """False: the connection is closed once this response is sent (`force_close`)."""
        self._connection: Connection | None = None
        self._chunked = False

    @property
    def prepared(self) -> bool:
        """Whether its head was sent."""
        return self._connection is not None

    def force_close(self) -> None:
        """Close the connection once this response is sent."""
        self.keep_alive = False

    def head(self, chunked: bool, length: int | None) -> bytes:
        """Its status line and header fields, framed as `chunked` or by `length` (None: neither)."""
        keep = self.keep_alive and self.headers.get("Connection", "").lower() != "close"
        self.keep_alive = keep
        lines = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}"]
        lines += [f"{name}: {value}" for name, value in self.headers.items() if name.lower() != "connection"]
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        elif length is not None:
            lines.append(f"Content-Length: {length}")
        if not keep:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def prepare(self, request: Request) -> None:
        """Send its head to `request`'s client.

        Raises:
            ConnectionResetError: the connection is closed.
        """
        connection = request._connection
        self._chunked = self.content_length is None and not request.http10
        if self.content_length is None and request.http10:
            self.keep_alive = False  # the end of the body is the end of the connection
        if not request.keep_alive:
            self.keep_alive = False
        self._connection = connection
        connection.response = self
        await connection.send(self.head(self._chunked, self.content_length))

    async def write(self, data: bytes) -> None:
        """Send `data` (one chunk); waits while the client's socket is full.

        Raises:
            ConnectionResetError: the connection is closed.
        """
        assert self._connection is not None, "prepare() first"
        if data:
            await self._connection.send(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)

    async def write_eof(self, data: bytes = b"") -> None:
        """Send `data` and the end of the body.

        Raises:
            ConnectionResetError: the connection is closed.
        """
        assert self._connection is not None, "prepare() first"
        if self._chunked:
            end = b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n"
            await self._connection.send(end)
        elif data:
            await self._connection.send(data)
        self._connection.finished()


class Response(StreamResponse):
    """A response whole in memory, written by the server once the handler returns it.

    Args:
        status: the HTTP status.
        body: its body (str: encoded as UTF-8).
        content_type: its ``Content-Type`` (None: the one in `headers`, else none for an empty
            body, ``application/octet-stream`` for another).
        headers: its other header fields.
    """

    def __init__(
        self,
        status: int = 200,
        body: bytes | str = b"",
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status, headers)
        self.body = body.encode() if isinstance(body, str) else body
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        elif self.body and "Content-Type" not in self.headers and "content-type" not in self.headers:
            self.headers["Content-Type"] = "application/octet-stream"

    def encoded(self) -> bytes:
        """Its head and body, in one piece (Content-Length framed)."""
        bodiless = self.status in (204, 304) or 100 <= self.status < 200
        return self.head(False, None if bodiless else len(self.body)) + (b"" if bodiless else self.body)


def json_response(data: Any, status: int = 200) -> Response:
    """A response of `data` as JSON."""
    return Response(status=status, body=orjson.dumps(data), content_type="application/json")
