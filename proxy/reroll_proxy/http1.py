"""A lean HTTP/1.1 client for the upstream (`Http1Upstream`): keep-alive connections on the event
loop's own transports (uvloop's when the proxy runs on it), each response parsed by an
``asyncio.Protocol`` as its bytes arrive.

Why not ``aiohttp.ClientSession``: per exchange it builds a request object, a cookie jar lookup,
tracing hooks, timers and a stream reader, and its CPU was most of what the proxy added over a
direct call (``scripts/bench/proxy.py --profile``). This client does what the proxy needs and
nothing else: ``POST`` one body, read a head, then a body framed by ``Content-Length``,
``Transfer-Encoding: chunked`` or the connection's close; ``gzip`` / ``deflate`` bodies are
decoded (``Accept-Encoding: identity`` is asked for, so they should not come). No cookies, no
redirects, no environment proxies (as the ``ClientSession`` it replaces).

A body read by chunks (`Http1Response.chunks`) gives everything that arrived since the last
chunk at once (several of the upstream's chunks in one piece when they came together).
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from reroll_contracts.errors import UpstreamError

if TYPE_CHECKING:
    from reroll_proxy.upstream import UpstreamRequest

IDLE_SECONDS = 15.0
"""A keep-alive connection idle longer than this is closed rather than reused (providers close
theirs after some seconds, and one closed under a request would fail it; aiohttp's default)."""
_MAX_HEAD_BYTES = 64 * 1024
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class _Connection(asyncio.Protocol):
    """One connection to the upstream and the parser of the response in flight on it."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._state = _DONE
        self._remaining = 0
        self.head: asyncio.Future[tuple[int, list[tuple[str, str]]]] | None = None
        self.body = bytearray()
        """Body bytes received and not yet taken by the reader (encoded as sent)."""
        self.finished = False
        self.keep_alive = True
        self.error: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (TCP or TLS)

    def begin(self, request: bytes) -> asyncio.Future[tuple[int, list[tuple[str, str]]]]:
        """Send `request` (its whole bytes) and return the future of the response's head."""
        assert self.transport is not None
        self._state, self.finished, self.keep_alive, self.error = _HEAD, False, True, None
        self.body.clear()
        self.head = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.head

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._parse()
        except ValueError as exc:
            self._fail(f"malformed response from the upstream: {exc}")
            self.close()
        self._wake()

    def eof_received(self) -> bool | None:
        if self._state == _UNTIL_CLOSE:
            self._state, self.finished = _DONE, True
        elif self._state != _DONE:
            self._fail("the upstream closed the connection mid-response")
        self.closed = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == _UNTIL_CLOSE and exc is None:
            self._state, self.finished = _DONE, True
        elif self._state != _DONE:
            self._fail(f"the upstream connection was lost mid-response: {exc!r}")
        self._wake()

    def close(self) -> None:
        """Close the connection (whatever is in flight on it fails)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: str) -> None:
        self.error, self._state, self.keep_alive = error, _DONE, False
        if self.head is not None and not self.head.done():
            self.head.set_exception(UpstreamError(error))

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Wait for more body bytes, the body's end or an error (`UpstreamError` after `timeout` s)."""
        if self.body or self.finished or self.error is not None:
            return
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            self.close()
            raise UpstreamError(f"no bytes from the upstream within {timeout:g} s") from None

    def _parse(self) -> None:
        """Consume what `_buffer` holds as far as it goes (a state machine over the framing)."""
        buffer = self._buffer
        while buffer:
            state = self._state
            if state == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > _MAX_HEAD_BYTES:
                        raise ValueError("response head too large")
                    return
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                self._head(head)
            elif state in (_LENGTH, _CHUNK_DATA):
                taken = buffer[: self._remaining]
                del buffer[: len(taken)]
                self.body += taken
                self._remaining -= len(taken)
                if not self._remaining:
                    self._state = _CHUNK_END if state == _CHUNK_DATA else self._end()
            elif state in (_CHUNK_SIZE, _CHUNK_END, _TRAILER):
                if state == _CHUNK_SIZE and not self._whole_chunks():
                    continue
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buffer[:end])
                del buffer[: end + 2]
                self._line(state, line)
            elif state == _UNTIL_CLOSE:
                self.body += buffer
                buffer.clear()
            else:
                raise ValueError("bytes after the end of the response")

    def _whole_chunks(self) -> bool:
        """Take every complete chunk at the start of `_buffer` in one pass (the common case: a
        read brings whole chunks); the general path goes on from a partial or the last chunk.

        Returns:
            Whether bytes are left for the general path.
        """
        buffer, body, start = self._buffer, self.body, 0
        while (end := buffer.find(b"\r\n", start)) >= 0:
            size = _chunk_size(buffer[start:end])
            stop = end + 2 + size
            if not size or len(buffer) < stop + 2:
                break
            if buffer[stop : stop + 2] != b"\r\n":
                raise ValueError("chunk not followed by CRLF")
            body += buffer[end + 2 : stop]
            start = stop + 2
        del buffer[:start]
        return bool(buffer)

    def _line(self, state: int, line: bytes) -> None:
        if state == _CHUNK_END:
            if line:
                raise ValueError("chunk not followed by CRLF")
            self._state = _CHUNK_SIZE
        elif state == _TRAILER:
            if not line:
                self._state = self._end()
        else:
            self._remaining = _chunk_size(line)
            self._state = _CHUNK_DATA if self._remaining else _TRAILER

    def _end(self) -> int:
        self.finished = True
        return _DONE

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        status = int(rest[:3])
        if not version.startswith("HTTP/1.") or not 100 <= status <= 599:
            raise ValueError(f"bad status line {lines[0]!r}")
        if status < 200:  # 100 Continue and the like: the real head follows
            return
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(f"bad header line {line!r}")
            headers.append((name.strip(), value.strip()))
        found = {name.lower(): value.lower() for name, value in headers}
        self.keep_alive = version == "HTTP/1.1" and found.get("connection") != "close"
        if "chunked" in found.get("transfer-encoding", ""):
            self._state = _CHUNK_SIZE
        elif "content-length" in found:
            self._remaining = int(found["content-length"])
            self._state = _LENGTH if self._remaining else self._end()
        elif status in (204, 304):
            self._state = self._end()
        else:
            self._state, self.keep_alive = _UNTIL_CLOSE, False
        assert self.head is not None
        if not self.head.done():
            self.head.set_result((status, headers))


class Http1Response:
    """An `reroll_proxy.upstream.UpstreamResponse` read off one `_Connection`; leaving it (``async
    with``) gives the connection back for reuse when its response was read to the end."""

    def __init__(
        self,
        pool: Http1Upstream,
        key: tuple[str, str, int],
        connection: _Connection,
        status: int,
        headers: list[tuple[str, str]],
    ) -> None:
        self._pool, self._key, self._connection = pool, key, connection
        self.status = status
        """The HTTP status."""
        self.headers: Iterable[tuple[str, str]] = headers
        """The response headers as (name, value) pairs, in order."""
        found = {name.lower(): value for name, value in headers}
        self.content_type = (
            found.get("content-type", "application/octet-stream").split(";")[0].strip().lower()
        )
        """The media type without parameters."""
        encoding = found.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "deflate", "x-gzip"):
            raise UpstreamError(f"the upstream answered in an encoding not asked for: {encoding}")
        self._decoder = None if encoding == "identity" else zlib.decompressobj(wbits=47)

    async def read(self) -> bytes:
        """The whole body.

        Raises:
            UpstreamError: the body broke off, or no byte came within the timeout.
        """
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive: each piece is everything received since the last.

        Raises:
            UpstreamError: the body broke off, or no byte came within the timeout.
        """
        connection, timeout = self._connection, self._pool.timeout_seconds
        while True:
            await connection.wait(timeout)
            if connection.body:
                piece = bytes(connection.body)
                connection.body.clear()
                piece = self._decoder.decompress(piece) if self._decoder is not None else piece
                if piece:
                    yield piece
                continue
            if connection.error is not None:
                raise UpstreamError(connection.error)
            if connection.finished:  # every byte taken
                return

    async def __aenter__(self) -> Http1Response:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._pool.release(self._key, self._connection)


class Http1Upstream:
    """The provider over HTTP/1.1 (``http`` or ``https``): keep-alive connections, one request at
    a time on each, as many as requests in flight.

    Args:
        timeout_seconds: longest wait to connect, and for each read (the head, every piece of body).
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout_seconds = timeout_seconds
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def send(self, request: UpstreamRequest) -> Http1Response:
        """See `reroll_proxy.upstream.Upstream.send`.

        Raises:
            UpstreamError: a bad URL or header, no connection, or no head within the timeout.
        """
        key, target, host = _route(request.url)
        payload = _request_bytes(target, host, request.headers, request.body)
        connection = await self._acquire(key)
        head = connection.begin(payload)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                status, headers = await head
            return Http1Response(self, key, connection, status, headers)
        except TimeoutError:
            connection.close()
            raise UpstreamError(f"no answer from the upstream within {self.timeout_seconds:g} s") from None
        except BaseException:
            connection.close()
            raise

    async def _acquire(self, key: tuple[str, str, int]) -> _Connection:
        idle = self._idle.get(key, [])
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        tls = self._ssl if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=tls, server_hostname=host if tls else None
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc!r}") from exc
        return connection

    def release(self, key: tuple[str, str, int], connection: _Connection) -> None:
        """Take `connection` back: kept for the next request if its response ended cleanly and
        the upstream keeps it alive, else closed."""
        if connection.finished and connection.keep_alive and not connection.closed and not self._closed:
            connection.idle_since = time.monotonic()
            self._idle.setdefault(key, []).append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        """See `reroll_proxy.upstream.Upstream.aclose`."""
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()


@functools.lru_cache(maxsize=256)
def _route(url: str) -> tuple[tuple[str, str, int], str, str]:
    """Where `url` goes: its connection key (scheme, host, port), its request target (path and
    query) and its ``Host`` header (parsed once per URL: the same few come with every request).

    Raises:
        UpstreamError: not an http(s) URL with a host.
        ValueError: its port is not a number in range.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamError(f"not an http(s) URL: {url}")
    key = (parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return key, target, parts.netloc.rpartition("@")[2]


def _chunk_size(line: bytes | bytearray) -> int:
    """The size of a chunk from its size line (hex digits, then maybe ``;extensions``).

    Raises:
        ValueError: not a size.
    """
    size = int(line.split(b";", 1)[0], 16)
    if size < 0:
        raise ValueError(f"bad chunk size {bytes(line)!r}")
    return size


def _request_bytes(target: str, host: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """The bytes of ``POST target`` with `headers` and `body`, head and body in one piece.

    Raises:
        UpstreamError: a header would break the head (a line break, a colon in its name, a
            character outside Latin-1).
    """
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines.append("Accept-Encoding: identity")
    for name, value in headers.items():
        if name.lower() in _SET_HERE:
            continue
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise UpstreamError(f"header {name!r} holds a line break or a colon")
        lines.append(f"{name}: {value}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    except UnicodeEncodeError as exc:
        raise UpstreamError(f"a header holds a character outside Latin-1: {exc}") from exc


_SET_HERE = frozenset({"host", "content-length", "accept-encoding", "transfer-encoding", "connection"})
