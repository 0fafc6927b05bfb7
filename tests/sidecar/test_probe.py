"""The sidecar's ``probe`` command (`reroll_sidecar.probe`): a service's readiness seen from inside
the sandbox — an HTTP GET that must answer 2xx, or a TCP connect."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest
from reroll_sidecar import probe


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/health": 200, "/moved": 302}.get(self.path, 503)
        self.send_response(status)
        self.send_header("Location", "/health")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_http_is_healthy_on_2xx_only(server: int) -> None:
    assert probe.probe(f"http://127.0.0.1:{server}/health", 2) == (
        True,
        f"GET http://127.0.0.1:{server}/health: HTTP 200",
    )
    assert probe.probe(f"http://127.0.0.1:{server}/starting", 2)[0] is False
    assert probe.probe(f"http://127.0.0.1:{server}/moved", 2)[0] is False  # no redirect followed


def test_tcp_is_healthy_when_a_connection_is_accepted(server: int) -> None:
    assert probe.probe(f"tcp://127.0.0.1:{server}", 2)[0] is True
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    healthy, seen = probe.probe(f"tcp://127.0.0.1:{port}", 2)
    assert not healthy and "cannot connect" in seen


@pytest.mark.parametrize("target", ["ftp://x/", "tcp://nohost", "localhost:80"])
def test_a_bad_target_exits_2(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main([target]) == 2
    assert "not" in capsys.readouterr().err
