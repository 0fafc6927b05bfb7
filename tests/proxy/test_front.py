"""The proxy's HTTP/1.1 server (`reroll_proxy.front`), in process, over raw sockets: framing,
keep-alive and pipelining, the refusals (400, 404 / 405, 413, 500), and a client that hangs up
cancelling its handler. The limits' timeouts are in ``test_limits.py``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from reroll_contracts.proxy import ClientLimits
from reroll_proxy.front import MAX_HEAD_BYTES, Handler, Router, Server
from reroll_proxy.messages import Request, Response, StreamResponse, json_response

Client = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class App:
    """A server of a few routes, and what its handlers saw."""

    def __init__(self) -> None:
        self.routes: Router[Handler] = Router()
        self.cancelled = asyncio.Event()
        self.routes.add("POST", "/echo", self.echo)
        self.routes.add("GET", "/items/{item}", self.item)
        self.routes.add("GET", "/stream", self.stream)
        self.routes.add("GET", "/boom", self.boom)
        self.routes.add("GET", "/hang", self.hang)

    async def dispatch(self, request: Request) -> StreamResponse:
        route, handler = self.routes.resolve(request)
        if handler is None:
            return json_response({"error": "none"}, status=404 if route is None else 405)
        return await handler(request)

    async def echo(self, request: Request) -> Response:
        body = await request.read()
        return Response(body=body, headers={"x-query": request.query.get("q", "")})

    async def item(self, request: Request) -> Response:
        return json_response({"item": request.match_info["item"]})

    async def stream(self, request: Request) -> StreamResponse:
        response = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: 1\n\n")
        await response.write_eof(b"data: 2\n\n")
        return response

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("a handler's bug")

    async def hang(self, request: Request) -> Response:
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")


@pytest.fixture
async def served() -> AsyncIterator[tuple[App, int]]:
    app = App()
    server = Server(app.dispatch, ClientLimits(max_request_bytes=1000))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = await server.listen(sock)
    yield app, sock.getsockname()[1]
    site.close()
    await server.shutdown()


@contextlib.asynccontextmanager
async def connected(port: int) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response's head and its body (Content-Length or chunked framing)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), None)
    if length is not None:
        return head, await reader.readexactly(length)
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readexactly(2)
    return head, body


async def test_pipelined_requests_are_answered_in_order_on_one_connection(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(
            b"POST /echo?q=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /items/42 HTTP/1.1\r\nHost: h\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        first, second, third = [await response(reader) for _ in range(3)]
    assert first[0].startswith(b"HTTP/1.1 200 OK") and b"x-query: 1" in first[0] and first[1] == b"hello"
    assert second[1] == b'{"item":"42"}'
    assert third[1] == b"abcde"


async def test_a_stream_is_chunked_and_the_connection_kept(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        for _ in range(2):
            writer.write(b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
            head, body = await response(reader)
            assert b"transfer-encoding: chunked" in head.lower() and body == b"data: 1\n\ndata: 2\n\n"


async def test_http10_gets_an_unframed_stream_then_the_close(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
        received = await reader.read()  # to the close
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"chunked" not in head.lower() and b"connection: close" in head.lower()
    assert body == b"data: 1\n\ndata: 2\n\n"


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /nowhere HTTP/1.1\r\nHost: h\r\n\r\n", b"404"),
        (b"DELETE /echo HTTP/1.1\r\nHost: h\r\n\r\n", b"405"),
        (b"GET /items/1/2 HTTP/1.1\r\nHost: h\r\n\r\n", b"404"),
        (b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n", b"500"),
    ],
)
async def test_refusals_keep_the_connection(
    served: tuple[App, int], request_bytes: bytes, status: bytes
) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(request_bytes + b"GET /items/7 HTTP/1.1\r\nHost: h\r\n\r\n")
        head, _ = await response(reader)
        assert head.startswith(b"HTTP/1.1 " + status), head
        assert (await response(reader))[1] == b'{"item":"7"}'


async def test_a_body_over_the_limit_gets_413_and_the_close(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000)
        received = await reader.read()
    assert received.startswith(b"HTTP/1.1 413") and b"request_too_large" in received


async def test_a_malformed_request_gets_400_and_the_close(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"GET / HTTP/1.1\r\nHost h\r\n\r\n")
        received = await reader.read()
    assert received.startswith(b"HTTP/1.1 400")


async def test_a_client_that_hangs_up_cancels_its_handler(served: tuple[App, int]) -> None:
    app, port = served
    async with connected(port) as (_, writer):
        writer.write(b"GET /hang HTTP/1.1\r\nHost: h\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
    await asyncio.wait_for(app.cancelled.wait(), 5)


async def test_a_head_growing_over_the_limit_gets_431(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"GET /items/1 HTTP/1.1\r\nHost: h\r\nx-pad: ")
        for _ in range(MAX_HEAD_BYTES // 4096 + 1):  # one header field that never ends
            writer.write(b"y" * 4096)
            await writer.drain()
            await asyncio.sleep(0.001)
        received = await reader.read()
    assert received.startswith(b"HTTP/1.1 431")


async def test_expect_100_continue_is_answered_before_the_body(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"ok")
        assert (await response(reader))[1] == b"ok"


async def test_many_pipelined_requests_are_all_answered(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(b"".join(b"GET /items/%d HTTP/1.1\r\nHost: h\r\n\r\n" % index for index in range(100)))
        bodies = [(await response(reader))[1] for _ in range(100)]
    assert bodies == [b'{"item":"%d"}' % index for index in range(100)]


async def test_an_upgrade_is_answered_plainly_then_closed(served: tuple[App, int]) -> None:
    async with connected(served[1]) as (reader, writer):
        writer.write(
            b"GET /items/3 HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            b"GET /items/4 HTTP/1.1\r\nHost: h\r\n\r\n"  # after an upgrade: not HTTP any more
        )
        received = await asyncio.wait_for(reader.read(), 5)  # to the close
    assert received.startswith(b"HTTP/1.1 200") and b"connection: close" in received.lower()
    assert received.endswith(b'{"item":"3"}')
