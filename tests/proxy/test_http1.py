"""The lean HTTP/1.1 upstream client (`reroll_proxy.http1`): every body framing, byte by byte,
keep-alive reuse, and its errors as `UpstreamError`. The server is a raw asyncio socket server
that answers each request with canned bytes, so every response shape can be written exactly."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from reroll_contracts.errors import UpstreamError
from reroll_proxy import http1
from reroll_proxy.http1 import Http1Upstream
from reroll_proxy.upstream import UpstreamRequest


@dataclass
class RawServer:
    """Answers the i-th request with ``answers[i]``'s pieces, each written on its own (with a
    pause between), then closes the connection if ``close_after`` says so; after the last answer,
    holds the connection open until the client closes it."""

    answers: list[list[bytes]]
    close_after: bool = False
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                for piece in self.answers.pop(0):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.001)
                if self.close_after:
                    break
            else:
                await reader.read()  # keep the connection open until the client closes it
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def close(self) -> None:
        """Close every connection still open and wait until they are."""
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


Serve = Callable[..., Awaitable[RawServer]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Serve]:
    servers: list[tuple[asyncio.Server, RawServer]] = []

    async def serve(answers: list[list[bytes]], close_after: bool = False) -> RawServer:
        raw = RawServer(answers, close_after)
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append((server, raw))
        raw.port = server.sockets[0].getsockname()[1]
        return raw

    yield serve
    for server, raw in servers:
        server.close()
        await raw.close()
        await server.wait_closed()


def request(
    port: int, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None
) -> UpstreamRequest:
    return UpstreamRequest(
        f"http://127.0.0.1:{port}{path}", headers or {"Authorization": "Bearer k"}, b'{"a": 1}'
    )


def bytewise(data: bytes) -> list[bytes]:
    return [data[index : index + 1] for index in range(len(data))]


async def fetch(upstream: Http1Upstream, sent: UpstreamRequest) -> tuple[int, str, bytes, list[bytes]]:
    async with await upstream.send(sent) as response:
        pieces = [piece async for piece in response.chunks()]
        return response.status, response.content_type, b"".join(pieces), pieces


@pytest.mark.parametrize("split", [False, True])
async def test_a_content_length_body_and_the_request_sent(raw_server: Serve, split: bool) -> None:
    body = b'{"ok": true}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 12\r\n\r\n"
    server = await raw_server([bytewise(answer + body) if split else [answer + body]])
    upstream = Http1Upstream(5)
    try:
        sent = request(server.port, "/v1/messages?beta=true", {"x-api-key": "k", "anthropic-beta": "b"})
        assert (await fetch(upstream, sent))[:3] == (200, "application/json", body)
    finally:
        await upstream.aclose()
    (received,) = server.requests
    head, _, sent_body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/messages?beta=true HTTP/1.1" and sent_body == b'{"a": 1}'
    assert f"Host: 127.0.0.1:{server.port}".encode() in lines and b"x-api-key: k" in lines
    assert b"Accept-Encoding: identity" in lines and b"Content-Length: 8" in lines


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"b\r\ndata: one\n\n\r\n"
    b"B;ext=1\r\ndata: two\n\n\r\n"
    b"0\r\nX-Trailer: t\r\n\r\n"
)


@pytest.mark.parametrize("split", [False, True])
async def test_a_chunked_body_is_decoded_and_the_connection_reused(raw_server: Serve, split: bool) -> None:
    server = await raw_server([bytewise(CHUNKED) if split else [CHUNKED]] * 2)
    upstream = Http1Upstream(5)
    try:
        for _ in range(2):
            status, media, body, pieces = await fetch(upstream, request(server.port))
            assert (status, media, body) == (200, "text/event-stream", b"data: one\n\ndata: two\n\n")
            assert all(pieces)
    finally:
        await upstream.aclose()
    assert server.connections == 1 and len(server.requests) == 2


async def test_a_stream_gives_its_pieces_as_they_arrive(raw_server: Serve) -> None:
    pieces = [CHUNKED[: CHUNKED.index(b"B;")], CHUNKED[CHUNKED.index(b"B;") :]]
    server = await raw_server([pieces])
    upstream = Http1Upstream(5)
    try:
        assert (await fetch(upstream, request(server.port)))[3] == [b"data: one\n\n", b"data: two\n\n"]
    finally:
        await upstream.aclose()


async def test_a_body_to_the_close_and_connection_close_are_not_reused(raw_server: Serve) -> None:
    to_close = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}"
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n[]"
    server = await raw_server([[to_close], [closing], [closing]], close_after=True)
    upstream = Http1Upstream(5)
    try:
        assert (await fetch(upstream, request(server.port)))[2] == b"{}"
        assert (await fetch(upstream, request(server.port)))[2] == b"[]"
        assert (await fetch(upstream, request(server.port)))[2] == b"[]"
    finally:
        await upstream.aclose()
    assert server.connections == 3


async def test_a_gzip_body_is_decoded(raw_server: Serve) -> None:
    packed = gzip.compress(b'{"ok": 1}')
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n"
    server = await raw_server([[head.encode(), packed[:5], packed[5:]]])
    upstream = Http1Upstream(5)
    try:
        async with await upstream.send(request(server.port)) as response:
            assert await response.read() == b'{"ok": 1}'
    finally:
        await upstream.aclose()


async def test_a_body_that_breaks_off_raises_after_what_came(raw_server: Serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    server = await raw_server([[answer]], close_after=True)
    upstream = Http1Upstream(5)
    received: list[bytes] = []
    try:
        async with await upstream.send(request(server.port)) as response:
            with pytest.raises(UpstreamError, match="mid-response"):
                async for piece in response.chunks():
                    received.append(piece)
    finally:
        await upstream.aclose()
    assert received == [b"hello"]


async def test_a_silent_upstream_times_out(raw_server: Serve) -> None:
    server = await raw_server([[b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe"]])
    upstream = Http1Upstream(1.0)
    try:
        async with await upstream.send(request(server.port)) as response:
            with pytest.raises(UpstreamError, match="no bytes from the upstream within 1 s"):
                await response.read()
        silent = await raw_server([[]])
        with pytest.raises(UpstreamError, match="no answer"):
            await upstream.send(request(silent.port))
    finally:
        await upstream.aclose()


async def test_errors_are_upstream_errors(raw_server: Serve) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    garbage = await raw_server([[b"SMTP ready\r\n\r\n"]])
    upstream = Http1Upstream(5)
    try:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await upstream.send(request(port))
        with pytest.raises(UpstreamError, match="line break"):
            await upstream.send(request(port, headers={"anthropic-beta": "x\r\nInjected: 1"}))
        with pytest.raises(UpstreamError, match="not an http"):
            await upstream.send(UpstreamRequest("ftp://host/x", {}, b""))
        with pytest.raises(UpstreamError, match="malformed"):
            await upstream.send(request(garbage.port))
    finally:
        await upstream.aclose()


async def test_a_connection_closed_or_idle_too_long_is_not_reused(
    raw_server: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream closing a kept-alive connection between requests (no ``Connection: close``
    announced), or the connection idle past `IDLE_SECONDS`: the next request opens a new one."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    closing = await raw_server([[answer], [answer]], close_after=True)
    upstream = Http1Upstream(5)
    try:
        assert (await fetch(upstream, request(closing.port)))[2] == b"{}"
        await asyncio.sleep(0.1)  # its FIN arrives
        assert (await fetch(upstream, request(closing.port)))[2] == b"{}"
        assert closing.connections == 2
        monkeypatch.setattr(http1, "IDLE_SECONDS", 0.0)
        idle = await raw_server([[answer], [answer]])
        for _ in range(2):
            assert (await fetch(upstream, request(idle.port)))[2] == b"{}"
        assert idle.connections == 2
    finally:
        await upstream.aclose()


@pytest.mark.spawns  # openssl makes the certificate
async def test_https_is_verified_against_the_trusted_cas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``https``: TLS with the host name checked, trusting the system's CAs (here a self-signed
    certificate for ``localhost`` made trusted through ``SSL_CERT_FILE``); an untrusted one fails
    to connect."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subject = ["-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes"]
    command += ["-keyout", str(key), "-out", str(cert)]
    subprocess.run([*command, *subject], check=True, capture_output=True)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    raw = RawServer([[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]])
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0, ssl=served)
    port = server.sockets[0].getsockname()[1]
    sent = UpstreamRequest(f"https://localhost:{port}/v1/messages", {}, b"{}")
    try:
        untrusting = Http1Upstream(5)
        with pytest.raises(UpstreamError, match="cannot connect"):
            await untrusting.send(sent)
        await untrusting.aclose()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusting = Http1Upstream(5)
        try:
            assert (await fetch(trusting, sent))[:3] == (200, "application/octet-stream", b"{}")
        finally:
            await trusting.aclose()
    finally:
        server.close()
        await raw.close()
        await server.wait_closed()
    assert raw.requests[0].startswith(b"POST /v1/messages HTTP/1.1\r\nHost: localhost:")
