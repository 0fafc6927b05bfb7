"""TCP-level faults: a Toxiproxy-compatible server between an agent and a rollout's LLM proxy.

The server is ``toxiproxy-server`` built by ``scripts/install-toxiproxy`` (a thin Toxiproxy REST
server over the ``noxious`` Rust crate) into ``<cache>/bin``; any real Toxiproxy works too. It is
driven with the ``toxiproxy-python`` client, so toxics are Toxiproxy's: ``latency``,
``bandwidth``, ``timeout``, ``reset_peer``, ``slicer``, ``limit_data``, ``slow_close``.

Put faults in front of a proxy (or of any HTTP base URL)::

    with ToxiproxyServer.start() as server:
        front = server.front("agent-side", proxy.base_url)  # e.g. http://127.0.0.1:PORT/v1
        front.proxy.add_toxic(type="latency", attributes={"latency": 500})
        client = openai.OpenAI(base_url=front.base_url, ...)   # the agent talks through it
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from reroll_contracts.errors import InfrastructureError
from toxiproxy import Toxiproxy

from reroll.cache import cache_dir

SERVER_ENV = "REROLL_TOXIPROXY_SERVER"
"""Environment variable naming a Toxiproxy-compatible server binary to use instead of the cached one."""


def find_server() -> Path | None:
    """The Toxiproxy server binary: ``$REROLL_TOXIPROXY_SERVER``, else
    ``<cache>/bin/toxiproxy-server`` (see ``scripts/install-toxiproxy``), else ``toxiproxy-server``
    on PATH; None when there is none."""
    if env := os.environ.get(SERVER_ENV):
        return Path(env)
    cached = cache_dir() / "bin" / "toxiproxy-server"
    if os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which("toxiproxy-server")
    return Path(on_path) if on_path else None


@dataclass
class Front:
    """A Toxiproxy proxy in front of an HTTP service.

    Attributes:
        proxy: the ``toxiproxy.proxy.Proxy`` (``add_toxic``, ``destroy_toxic``, ``disable``...).
        base_url: the service's base URL with host and port replaced by the proxy's listen address.
    """

    proxy: Any
    base_url: str


class ToxiproxyServer:
    """A running Toxiproxy-compatible server on loopback, and its ``toxiproxy-python`` client.

    The client library keeps its server address in a class attribute, so one server per process
    is driven at a time. Stop it explicitly (or use it as a context manager).

    Args:
        process: the server process, already listening.
        port: its API port on 127.0.0.1.
    """

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port
        self.client = Toxiproxy()
        self.client.update_api_consumer("127.0.0.1", port)

    @classmethod
    def start(cls, binary: Path | None = None, ready_timeout_seconds: float = 10.0) -> ToxiproxyServer:
        """Start the server on a free loopback port and wait until its API listens.

        Args:
            binary: the server binary (default: `find_server`).
            ready_timeout_seconds: how long to wait for its ``listening on HOST:PORT`` line.

        Raises:
            InfrastructureError: no server binary, or it exited or stayed silent past the timeout
                (the message has its output).
        """
        binary = binary or find_server()
        if binary is None:
            raise InfrastructureError(
                "no Toxiproxy server: run scripts/install-toxiproxy (needs cargo) or set " + SERVER_ENV
            )
        process = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert process.stdout is not None
        deadline = time.monotonic() + ready_timeout_seconds
        line = b""
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(process.stdout.fileno(), 1) if ready else b""
            if ready and not chunk:
                break
            line += chunk
        if not line.startswith(b"listening on ") or not line.endswith(b"\n"):
            _stop(process)
            raise InfrastructureError(
                f"Toxiproxy server {binary} did not start: {line.decode(errors='replace')!r}"
            )
        port = int(line.decode().strip().rsplit(":", 1)[1])
        return cls(process, port)

    def front(self, name: str, base_url: str) -> Front:
        """Create a Toxiproxy proxy named `name` in front of the HTTP service at `base_url`.

        Args:
            name: the Toxiproxy proxy name (unique on this server).
            base_url: ``http://HOST:PORT[/path]`` of the service.

        Returns:
            The proxy and the base URL to give the client instead of `base_url`.

        Raises:
            ValueError: `base_url` has no host or port.
        """
        url = urllib.parse.urlsplit(base_url)
        if not url.hostname or not url.port:
            raise ValueError(f"base URL needs a host and a port: {base_url!r}")
        proxy = self.client.create(upstream=f"{url.hostname}:{url.port}", name=name, listen="127.0.0.1:0")
        return Front(proxy, urllib.parse.urlunsplit(url._replace(netloc=proxy.listen)))

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL after 5 s."""
        _stop(self.process)

    def __enter__(self) -> ToxiproxyServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    if process.stdout is not None:
        process.stdout.close()
