"""The proxy's HTTP/1.1 server: an `asyncio.Protocol` per connection, its requests parsed by
``httptools`` (llhttp), each answered by one handler (`Server`), in order.

Why not aiohttp's web server: per request it builds a request object with a URL, a payload
stream, a match-info chain and middlewares, and a response object with its own writer; measured,
that was about a fifth of the recording proxy's CPU per exchange (a bare aiohttp forwarder alone
adds 0.35x a plain mitmproxy's latency). Here a request is its head, its body bytes and a few
fields (`reroll_proxy.messages`).

What a connection is granted (`reroll_contracts.proxy.ClientLimits`): see `reroll_proxy.limits`.

A client that closes its connection cancels the handler of its request (a stream being served
sees `asyncio.CancelledError`); a handler's exception is a 500 (or, once its response is under
way, the connection closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import httptools
from multidict import CIMultiDict
from reroll_contracts.proxy import ClientLimits

from reroll_proxy.limits import LINGER_SECONDS, size_refusal, timeout_refusal
from reroll_proxy.messages import Request, Response, StreamResponse, json_response

log = logging.getLogger("reroll_proxy")
MAX_HEAD_BYTES = 64 * 1024
"""The largest request head (target and header fields) taken; a longer one gets 431."""
MAX_QUEUED = 16
"""Pipelined requests queued on one connection before it stops reading until they are answered."""
SHUTDOWN_SECONDS = 0.5
"""How long stopping the server waits for requests in flight before cancelling them."""
Handler = Callable[[Request], Awaitable[StreamResponse]]
RouteDef = tuple[str, str, Handler]
"""A route to add to a `Router`: (method, path, handler), e.g. ``("DELETE", "/x/{id}", remove)``."""
T = TypeVar("T")


class Router(Generic[T]):
    """Routes by method and path: exact paths, and paths ending in one ``{name}`` segment."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, T]] = {}
        self._named: list[tuple[str, str, dict[str, T]]] = []
        """(prefix with its trailing slash, segment name, target by method)."""

    def add(self, method: str, path: str, target: T) -> None:
        """Route `method` `path` (e.g. ``/v1/models/{model_id}``) to `target`."""
        head, slash, last = path.rpartition("/")
        if last.startswith("{") and last.endswith("}"):
            prefix = head + slash
            for known, _, targets in self._named:
                if known == prefix:
                    targets[method] = target
                    return
            self._named.append((prefix, last[1:-1], {method: target}))
            return
        self._exact.setdefault(path, {})[method] = target

    def resolve(self, request: Request) -> tuple[str | None, T | None]:
        """The route `request`'s path matches (its canonical spelling, None: none) and its target
        for the request's method (None: another method's route); fills ``request.match_info``."""
        path = request.path
        targets = self._exact.get(path)
        if targets is not None:
            return path, targets.get(request.method)
        for prefix, name, named in self._named:
            if path.startswith(prefix) and (segment := path[len(prefix) :]) and "/" not in segment:
                request.match_info[name] = segment
                return prefix + "{" + name + "}", named.get(request.method)
        return None, None


class Server:
    """Serves HTTP/1.1 on any number of listening sockets with one `handler`.

    Args:
        handler: answers each request (its body read whole first).
        limits: what one client connection is granted (the module docstring).
    """

    def __init__(self, handler: Handler, limits: ClientLimits) -> None:
        self.handler = handler
        self.limits = limits
        self.connections: set[Connection] = set()

    async def listen(self, sock: socket.socket) -> asyncio.Server:
        """Accept connections on `sock` (bound) until the returned server is closed."""
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: Connection(self), sock=sock)

    async def shutdown(self) -> None:
        """Wait up to `SHUTDOWN_SECONDS` for the requests in flight, then cancel them; close
        every connection."""
        tasks = [task for connection in self.connections if (task := connection.task) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS)
        for connection in list(self.connections):
            connection.close()
        if tasks:
            await asyncio.wait(tasks)


class Connection(asyncio.Protocol):
    """One client connection: parses its requests and answers them in order (see the module)."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._limit = server.limits.max_request_bytes
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.sockname: tuple[str, int] | None = None
        """The (host, port) it arrived at."""
        self.task: asyncio.Task[None] | None = None
        """Answering the queued requests (None: idle)."""
        self.response: StreamResponse | None = None
        """The response under way (prepared, not finished)."""
        self._queue: deque[Request] = deque()
        self._parsing: Request | None = None
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._in_head = False
        """Whether a request head has begun and is not complete yet."""
        self._head_bytes = 0
        """Bytes received while in that head (llhttp buffers a header field whole: bounded here)."""
        self._paused = False
        self._idle: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future[None] | None = None
        self._lingering = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        self.sockname = transport.get_extra_info("sockname")
        self._server.connections.add(self)
        self._wait_for_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._server.connections.discard(self)
        self._stop_idle()
        for request in [*self._queue, *filter(None, [self._parsing])]:
            request.finish(ConnectionResetError("the client closed the connection"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError("the client closed the connection"))
            self._writable.exception()
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # a Responses WebSocket, an h2c offer: llhttp stops
            if self._queue:  # at its head (a body is not read); answered as a plain request, then closed
                self._queue[-1].keep_alive = False
        except httptools.HttpParserError as exc:
            self._refuse(json_response({"error": f"malformed request: {exc}"}, status=400))
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                error = {"error": f"request head over {MAX_HEAD_BYTES} bytes"}
                self._refuse(json_response(error, status=431))

    def eof_received(self) -> bool:
        return False  # a half-closed client: close (a request in flight is cancelled)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._url, self._headers, self._in_head = b"", [], True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._stop_idle()
        parser = self._parser
        request = Request(
            self,
            parser.get_method().decode("latin-1"),
            self._url.decode("latin-1"),
            CIMultiDict(self._headers),
            parser.should_keep_alive(),
            parser.get_http_version() == "1.0",
        )
        self._parsing = request
        self._queue.append(request)
        if len(self._queue) > MAX_QUEUED and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._answer_queued())

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.feed(body, self._limit)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.finish()
            self._parsing = None

    # writing

    async def send(self, data: bytes) -> None:
        """Write `data`; wait while the client's socket is full.

        Raises:
            ConnectionResetError: the connection is closed (or closing).
        """
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(data)
        if self._writable is not None:
            await self._writable

    def finished(self) -> None:
        """The response under way was sent whole."""
        self.response = None

    def close(self) -> None:
        """Close the connection (a request in flight is cancelled)."""
        if self.transport is not None:
            self.transport.close()

    # answering

    async def _answer_queued(self) -> None:
        """Answer the queued requests in order; then wait for the next head (or close)."""
        try:
            while self._queue:
                request = self._queue[0]
                try:
                    keep_alive = await self._answer(request)
                except ConnectionResetError:  # the client is gone
                    keep_alive = False
                self._queue.popleft()
                if self._paused and not self._queue and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                if not keep_alive:
                    if request.complete:
                        self.close()
                    else:
                        self._linger()
                    return
        finally:
            self.task = None
        if self.transport is not None and not self._queue:
            self._wait_for_head()

    async def _answer(self, request: Request) -> bool:
        """Read `request`'s body in time, have the handler answer it, send the answer.

        Returns:
            Whether the connection may serve another request.
        """
        limits = self._server.limits
        if not request.complete:
            if request.headers.get("Expect", "").lower() == "100-continue" and not request.http10:
                await self.send(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits 1 s for it
            try:
                async with asyncio.timeout(limits.body_timeout_seconds):
                    await request.wait_body()
            except TimeoutError:
                return await self._send_refusal(timeout_refusal(limits))
        if request.too_large:
            return await self._send_refusal(size_refusal(limits))
        try:
            response = await self._server.handler(request)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("error handling %s %s", request.method, request.path)
            if self.response is not None:  # its head is sent: the client sees a broken body
                return False
            response = json_response({"error": "internal server error"}, status=500)
        if self.response is not None:  # a stream its handler did not end (the connection is gone)
            return False
        if not response.prepared:
            assert isinstance(response, Response), "a StreamResponse is sent by its handler"
            if not request.keep_alive or request.http10:
                response.force_close()
            await self.send(response.encoded())
        return response.keep_alive

    async def _send_refusal(self, response: Response) -> bool:
        with contextlib.suppress(ConnectionResetError):
            await self.send(response.encoded())
        return False

    def _refuse(self, response: Response) -> None:
        """Answer an unparsable request at once and close the lingering way."""
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None and not self.transport.is_closing() and self.response is None:
            response.force_close()
            self.transport.write(response.encoded())
        self._linger()

    def _linger(self) -> None:
        """Send a FIN, drop what the client still sends, close after `LINGER_SECONDS`."""
        transport = self.transport
        if transport is None:
            return
        self._lingering = True
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, transport.close)

    def _wait_for_head(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(self._server.limits.header_timeout_seconds, self.close)

    def _stop_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
