"""reroll's MCP bridge (``mcp-call``) as the sandbox runs it: copied with the filter into a folder
and run by the system's ``python3`` (no reroll importable), against real MCP servers on this
machine: a stdio one (a subprocess), a streamable-HTTP one and a 2024-11-05 SSE one (HTTP servers
on loopback in this process)."""

from __future__ import annotations

import inspect
import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from reroll.rollout.mcp import BRIDGE_SOURCE, FILTER_SOURCE

pytestmark = pytest.mark.spawns
PYTHON = "/usr/bin/python3"  # the sandbox's python3, not this venv's

TOOLS = [
    {"name": "read", "description": "Read it.", "inputSchema": {"type": "object"},
     "_meta": {"_fastmcp": {"tags": ["inbox"]}}},
    {"name": "purge", "description": "Purge it.", "inputSchema": {"type": "object"},
     "_meta": {"_fastmcp": {"tags": ["inbox", "admin"]}}},
]  # fmt: skip


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    """The test servers' answer to `message` (None for a notification): ``tools/call`` echoes the
    tool's name and arguments; a tool named ``fail`` reports an error."""
    if "id" not in message:
        return None
    method, params = message["method"], message.get("params") or {}
    if method == "tools/list":
        result: dict[str, Any] = {"tools": TOOLS}
    elif method == "tools/call":
        text = f"called {params['name']} with {json.dumps(params['arguments'], sort_keys=True)}"
        result = {"content": [{"type": "text", "text": text}], "isError": params["name"] == "fail"}
    else:
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "t"}}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


STDIO_SERVER = "\n".join(
    [
        "from __future__ import annotations",
        "import json, sys",
        "from typing import Any",
        f"TOOLS = {TOOLS!r}",
        inspect.getsource(answer),
        "for message in map(json.loads, sys.stdin):",
        "    if (reply := answer(message)) is not None:",
        "        print('a stray line that is not JSON', flush=True)",
        "        print(json.dumps(reply), flush=True)",
    ]
)
"""The stdio server: `answer` over MCP's stdio transport (and a stray line before each answer)."""


@pytest.fixture
def bridge(tmp_path: Path) -> Path:
    """The bridge and the filter copied into a folder, as `reroll.rollout.extensions.services` does."""
    folder = tmp_path / "mcp"
    folder.mkdir()
    shutil.copy(BRIDGE_SOURCE, folder / BRIDGE_SOURCE.name)
    shutil.copy(FILTER_SOURCE, folder / FILTER_SOURCE.name)
    (tmp_path / "server.py").write_text(STDIO_SERVER)
    return folder


def call(folder: Path, servers: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    config = folder / "bridge.json"
    config.write_text(json.dumps({"servers": servers}))
    command = [PYTHON, "-B", str(folder / BRIDGE_SOURCE.name), str(config), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=folder)


def stdio(folder: Path, **filters: list[str]) -> dict[str, Any]:
    return {"transport": "stdio", "command": PYTHON, "args": [str(folder.parent / "server.py")], **filters}


def test_stdio_lists_and_calls_and_applies_the_filters(bridge: Path) -> None:
    servers = {"mail": stdio(bridge), "kept": stdio(bridge, exclude_tags=["admin"])}
    assert call(bridge, servers, "--list").stdout.split("\n")[:2] == ["mail (stdio)", "kept (stdio)"]
    listed = call(bridge, servers, "mail", "--list")
    assert (
        listed.returncode == 0 and "read: Read it." in listed.stdout and "purge: Purge it." in listed.stdout
    )
    assert "purge" not in call(bridge, servers, "kept", "--list").stdout
    done = call(bridge, servers, "kept", "read", '{"id": 2}')
    assert (done.returncode, done.stdout) == (0, 'called read with {"id": 2}\n')
    refused = call(bridge, servers, "kept", "purge")  # filtered out: never reaches the server
    assert refused.returncode == 2 and "unknown tool 'purge'" in refused.stderr
    named = call(bridge, {"mail": stdio(bridge, tools=["read"])}, "mail", "purge")
    assert named.returncode == 2


def test_a_tool_error_and_a_bad_command_line_have_their_exit_status(bridge: Path) -> None:
    servers = {"mail": stdio(bridge)}
    failed = call(bridge, servers, "mail", "fail", "{}")
    assert (failed.returncode, failed.stdout) == (1, "called fail with {}\n")
    assert call(bridge, servers, "nobody", "read").returncode == 2
    assert call(bridge, servers, "mail", "read", "not json").returncode == 2
    assert call(bridge, servers, "mail", "read", "[1]").returncode == 2
    assert call(bridge, servers).returncode == 2
    gone = {"mail": {"transport": "stdio", "command": "sh", "args": ["-c", "echo broken >&2"]}}
    broken = call(bridge, gone, "mail", "read")
    assert broken.returncode == 3 and "broken" in broken.stderr  # the server's stderr shown
    assert (
        call(bridge, {"mail": {"transport": "stdio", "command": "/nonexistent"}}, "mail", "--list").returncode
        == 3
    )


class StreamableHttp(BaseHTTPRequestHandler):
    """Streamable HTTP: a session id from ``initialize``, required after it; ``tools/list``
    answered as an SSE stream, anything else as JSON; the headers of each POST kept."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        StreamableHttp.seen.append(dict(self.headers))
        if message.get("method") != "initialize" and self.headers.get("Mcp-Session-Id") != "s-1":
            self.send_response(400)
            self.end_headers()
            return
        reply = answer(message)
        if reply is None:
            self.send_response(202)
            self.end_headers()
            return
        streamed = message["method"] == "tools/list"
        body = (f"event: message\ndata: {json.dumps(reply)}\n\n" if streamed else json.dumps(reply)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.send_header("Mcp-Session-Id", "s-1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self) -> None:
        self.send_response(405)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


class Sse(BaseHTTPRequestHandler):
    """The 2024-11-05 transport: ``GET /sse`` names the endpoint and carries the answers; each
    ``POST /messages`` is accepted (202) and answered on the stream."""

    answers: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b"event: endpoint\ndata: /messages?session=1\n\n")
        self.wfile.flush()
        while (reply := Sse.answers.get(timeout=30)) is not None:
            self.wfile.write(f"event: message\ndata: {json.dumps(reply)}\n\n".encode())
            self.wfile.flush()

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        if (reply := answer(message)) is not None:
            Sse.answers.put(reply)
            if message["method"] == "tools/call":
                Sse.answers.put(None)  # the last request of a session: end the stream

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A loopback HTTP server with the handler the test names (its base URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), request.param)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("http_server", [StreamableHttp], indirect=True)
def test_streamable_http_keeps_the_session_and_sends_the_headers(bridge: Path, http_server: str) -> None:
    StreamableHttp.seen.clear()
    server = {"transport": "streamable-http", "url": f"{http_server}/mcp",
              "headers": {"Authorization": "Bearer t"}, "include_tags": ["inbox"]}  # fmt: skip
    listed = call(bridge, {"remote": server}, "remote", "--list")
    assert listed.returncode == 0, listed.stderr
    assert "read: Read it." in listed.stdout
    done = call(bridge, {"remote": server}, "remote", "read", '{"q": "x"}')
    assert (done.returncode, done.stdout) == (0, 'called read with {"q": "x"}\n'), done.stderr
    assert all(headers["Authorization"] == "Bearer t" for headers in StreamableHttp.seen)
    assert StreamableHttp.seen[-1]["Mcp-Session-Id"] == "s-1"


@pytest.mark.parametrize("http_server", [Sse], indirect=True)
def test_sse_posts_to_the_endpoint_and_reads_the_stream(bridge: Path, http_server: str) -> None:
    servers = {"events": {"transport": "sse", "url": f"{http_server}/sse"}}
    done = call(bridge, servers, "events", "read", "{}")
    assert (done.returncode, done.stdout) == (0, "called read with {}\n"), done.stderr


def test_an_unreachable_server_is_exit_3(bridge: Path) -> None:
    down = {"transport": "streamable-http", "url": "http://127.0.0.1:9/mcp"}
    refused = call(bridge, {"down": down}, "down", "--list")
    assert refused.returncode == 3 and "mcp-call:" in refused.stderr
