"""`reroll_proxy.limits` in the real proxy: a half-sent request does not hold a connection open."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

from tests.proxy.conftest import TOKEN, Service, StartProxy

LIMITS = {"header_timeout_seconds": 1.0, "body_timeout_seconds": 1.0}


def connect(base_url: str) -> socket.socket:
    url = urlparse(base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def read_all(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the proxy sends until it closes the connection, and how long that took."""
    started, received = time.monotonic(), b""
    while chunk := sock.recv(65536):
        received += chunk
    return received, time.monotonic() - started


def test_a_half_sent_head_is_closed_after_the_header_timeout(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url, client_limits=LIMITS)
    with connect(proxy.base_url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n")  # never ends
        received, elapsed = read_all(sock)
    assert received == b"" and 0.5 < elapsed < 8, (received, elapsed)


def test_a_half_sent_body_gets_408_after_the_body_timeout(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url, client_limits=LIMITS)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    with connect(proxy.base_url) as sock:
        sock.sendall(head.encode() + b'{"model": ')  # 10 of the 100 bytes announced
        received, elapsed = read_all(sock)
    assert received.startswith(b"HTTP/1.1 408") and b"request_timeout" in received, received
    assert 0.5 < elapsed < 8, elapsed
    assert proxy.lines() == []
