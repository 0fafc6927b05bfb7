"""reroll's MCP bridge: a command-line MCP client for agents that have none (mini-swe-agent,
aider), so any agent reaches the task's MCP tools from its shell (standard library only: this file
is copied into the sandbox beside `reroll.rollout.mcp_filter`, whose tool filters it applies, and
run by the sandbox's Python through the ``mcp-call`` wrapper, `reroll.rollout.mcp.bridge_files`)::

    mcp-call --list                      # the servers: name and transport
    mcp-call SERVER --list               # SERVER's tools: name, description, arguments (JSON Schema)
    mcp-call SERVER TOOL ['{"arg": 1}']  # call TOOL with those arguments (a JSON object; none: {})

(``python3 mcp_bridge.py CONFIG ARGS...``, CONFIG the JSON file `reroll.rollout.mcp` writes:
``{"servers": {NAME: McpServerSpec as JSON}}``.)

Each invocation is one MCP session (specification 2025-06-18): ``initialize``, the
``notifications/initialized`` notification, the request (``tools/list`` or ``tools/call``), and
the end of the session. The transports: ``stdio`` starts the server's ``command`` with its
``args``, ``env`` (on top of this process's) and ``cwd``, one JSON-RPC message a line, and stops
it afterwards (a stdio server's state in memory does not outlive a call: the task's state lives in
its services); ``streamable-http`` POSTs each message to the ``url`` (its answer JSON or an SSE
stream; the ``Mcp-Session-Id`` the server gives is sent back); ``sse`` (2024-11-05) GETs the
``url``'s event stream, POSTs to the ``endpoint`` it names and reads the answers from the stream.
A server's ``headers`` go with every HTTP request. The server's requests to the client (``ping``)
are answered, its notifications ignored.

Output: a call prints the result's content (each text item as it is, any other item as JSON;
``structuredContent`` when there is no content). Exit status: 0 done; 1 the tool reported an error
(``isError``: its content is printed) or the server answered with a JSON-RPC error; 2 a bad
command line, an unknown server or a tool its filters leave out; 3 the server could not be reached
or broke the protocol or did not answer within ``$MCP_CALL_TIMEOUT`` seconds (default 120).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, Any

try:
    from reroll.rollout.mcp_filter import keeps, tool_tags
except ImportError:  # in the sandbox, which has no reroll: the filter is copied beside this file
    from mcp_filter import keeps, tool_tags  # type: ignore[no-redef]

PROTOCOL = "2025-06-18"
CLIENT_INFO = {"name": "reroll-mcp-bridge", "version": "1.0"}
USAGE = "usage: mcp-call --list | mcp-call SERVER --list | mcp-call SERVER TOOL [JSON_ARGUMENTS]"


class BridgeError(Exception):
    """A failure with its exit status (`code`) and the message printed on stderr."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _timeout() -> float:
    """Seconds a session may take (``$MCP_CALL_TIMEOUT``, default 120)."""
    try:
        return float(os.environ.get("MCP_CALL_TIMEOUT", "120"))
    except ValueError:
        return 120.0


def _answer_to(message: dict[str, Any]) -> dict[str, Any] | None:
    """The client's answer to a request of the server (``ping``: an empty result; any other: -32601);
    None for a notification or an answer."""
    if "method" not in message or "id" not in message:
        return None
    if message["method"] == "ping":
        return {"jsonrpc": "2.0", "id": message["id"], "result": {}}
    error = {"code": -32601, "message": f"method not found: {message['method']}"}
    return {"jsonrpc": "2.0", "id": message["id"], "error": error}


def _events(stream: IO[bytes]) -> Iterator[tuple[str, str]]:
    """The server-sent events of `stream`: (event name, data), ``message`` when unnamed."""
    name, data = "message", list[str]()
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = "message", list[str]()
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield name, "\n".join(data)


class Session:
    """One MCP session over a transport: `send` a message, `receive` the server's next one."""

    def send(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def receive(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        """End the session (stop a stdio server); errors here are nobody's concern."""

    def request(self, number: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send the request `method` (id `number`) and return its result.

        Raises:
            BridgeError: the server answered with an error (1) or broke the protocol (3).
        """
        self.send({"jsonrpc": "2.0", "id": number, "method": method, "params": params})
        while True:
            message = self.receive()
            if (answer := _answer_to(message)) is not None:
                self.send(answer)
            elif message.get("id") == number and "method" not in message:
                if "error" in message:
                    error = message["error"]
                    text = error.get("message") if isinstance(error, dict) else error
                    raise BridgeError(f"{method}: the server answered with an error: {text}", 1)
                result = message.get("result")
                if not isinstance(result, dict):
                    raise BridgeError(f"{method}: the server's answer has no result", 3)
                return result

    def open(self) -> None:
        """The handshake: ``initialize``, then ``notifications/initialized``."""
        capabilities: dict[str, Any] = {}
        self.request(0, "initialize", {"protocolVersion": PROTOCOL, "capabilities": capabilities,
                                       "clientInfo": CLIENT_INFO})  # fmt: skip
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})


class Stdio(Session):
    """A server started here, one JSON-RPC message a line on its stdin and stdout; its stderr kept
    aside and shown when it breaks."""

    def __init__(self, server: dict[str, Any]) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in `close`)
        env = os.environ | {str(k): str(v) for k, v in (server.get("env") or {}).items()}
        try:
            self.process = subprocess.Popen(
                [server["command"], *server.get("args", [])], cwd=server.get("cwd") or None, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            )  # fmt: skip
        except OSError as exc:
            raise BridgeError(f"cannot start the server {server['command']!r}: {exc}", 3) from exc
        self.timer = threading.Timer(_timeout(), self.process.kill)
        self.timer.start()

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()
        except OSError as exc:
            raise BridgeError(f"the server is gone: {exc}{self._stderr()}", 3) from exc

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while line := self.process.stdout.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not a message (a server's stray print)
            if isinstance(message, dict):
                return message
        raise BridgeError(f"the server ended without answering{self._stderr()}", 3)

    def _stderr(self) -> str:
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:].decode("utf-8", "replace").strip()
        return f"; its stderr:\n{tail}" if tail else ""

    def close(self) -> None:
        self.timer.cancel()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):  # the server is gone already
                self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


class _Http(Session):
    """What both HTTP transports share: the server's headers, a timeout, received messages queued."""

    def __init__(self, server: dict[str, Any]) -> None:
        self.url = str(server["url"])
        self.headers = {str(k): str(v) for k, v in (server.get("headers") or {}).items()}
        self.queue: list[dict[str, Any]] = []

    def _open(self, method: str, url: str, body: bytes | None, headers: dict[str, str]) -> Any:
        request = urllib.request.Request(url, data=body, method=method, headers=self.headers | headers)
        try:
            return urllib.request.urlopen(request, timeout=_timeout())
        except OSError as exc:  # urllib.error.URLError and HTTPError are OSErrors
            raise BridgeError(f"{method} {url}: {exc}", 3) from exc

    def _queue(self, text: str) -> None:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BridgeError(f"the server sent something that is not JSON: {text[:200]!r}", 3) from exc
        items = data if isinstance(data, list) else [data]
        self.queue += [item for item in items if isinstance(item, dict)]


class StreamableHttp(_Http):
    """Streamable HTTP: each message POSTed; its answer a JSON body or an SSE stream."""

    def __init__(self, server: dict[str, Any]) -> None:
        super().__init__(server)
        self.session_id: str | None = None

    def send(self, message: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session_id is not None:
            headers |= {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": PROTOCOL}
        with self._open("POST", self.url, json.dumps(message).encode(), headers) as response:
            self.session_id = response.headers.get("Mcp-Session-Id") or self.session_id
            if response.status == 202:
                return
            if response.headers.get_content_type() == "text/event-stream":
                for _name, data in _events(response):
                    self._queue(data)
            elif body := response.read():
                self._queue(body.decode("utf-8", "replace"))

    def receive(self) -> dict[str, Any]:
        if not self.queue:
            raise BridgeError("the server answered nothing", 3)
        return self.queue.pop(0)

    def close(self) -> None:
        if self.session_id is not None:
            with contextlib.suppress(BridgeError):  # a server may refuse to end sessions (405)
                self._open("DELETE", self.url, None, {"Mcp-Session-Id": self.session_id}).close()


class Sse(_Http):
    """The 2024-11-05 HTTP+SSE transport: answers on a GET stream, messages POSTed to its endpoint."""

    def __init__(self, server: dict[str, Any]) -> None:
        super().__init__(server)
        self.stream = self._open("GET", self.url, None, {"Accept": "text/event-stream"})
        self.events = _events(self.stream)
        for name, data in self.events:
            if name == "endpoint":
                self.endpoint = urllib.parse.urljoin(self.url, data.strip())
                return
        raise BridgeError(f"{self.url}: the event stream named no endpoint", 3)

    def send(self, message: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        self._open("POST", self.endpoint, json.dumps(message).encode(), headers).close()

    def receive(self) -> dict[str, Any]:
        while not self.queue:
            name, data = next(self.events, ("", ""))
            if not name:
                raise BridgeError("the server's event stream ended", 3)
            if name == "message":
                self._queue(data)
        return self.queue.pop(0)

    def close(self) -> None:
        self.stream.close()


Transport = Callable[[dict[str, Any]], Session]
TRANSPORTS: dict[str, Transport] = {"stdio": Stdio, "streamable-http": StreamableHttp, "sse": Sse}


def _tools(session: Session, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The server's tools (every page of ``tools/list``) that `filters` keep."""
    tools: list[dict[str, Any]] = []
    params: dict[str, Any] = {}
    for number in range(1, 1000):
        result = session.request(number, "tools/list", params)
        tools += [tool for tool in result.get("tools", []) if isinstance(tool, dict)]
        if not (cursor := result.get("nextCursor")):
            break
        params = {"cursor": cursor}
    return [tool for tool in tools if keeps(filters, str(tool.get("name")), tool_tags(tool))]


def _filters(server: dict[str, Any]) -> dict[str, list[str]]:
    return {name: server[name] for name in ("tools", "include_tags", "exclude_tags") if server.get(name)}


def list_tools(server: dict[str, Any]) -> str:
    """`server`'s tools (as its filters keep them), one paragraph each: name, description, the
    arguments' JSON Schema."""
    session = TRANSPORTS[server.get("transport", "sse")](server)
    try:
        session.open()
        tools = _tools(session, _filters(server))
    finally:
        session.close()
    lines = []
    for tool in tools:
        lines.append(f"{tool.get('name')}: {(tool.get('description') or '').strip()}")
        lines.append(f"  arguments: {json.dumps(tool.get('inputSchema') or {}, sort_keys=True)}")
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """A ``tools/call`` result as text: each text item as it is, any other as JSON;
    ``structuredContent`` when there is no content."""
    content = result.get("content") or []
    if not content and "structuredContent" in result:
        return json.dumps(result["structuredContent"], indent=2)
    parts = [
        item["text"] if isinstance(item, dict) and item.get("type") == "text" else json.dumps(item)
        for item in content
    ]
    return "\n".join(str(part) for part in parts)


def call_tool(server: dict[str, Any], tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """Call `tool` of `server` with `arguments`: (its result as text, whether it is an error).

    Raises:
        BridgeError: `server`'s filters leave `tool` out (2); the session failed (1, 3).
    """
    filters = _filters(server)
    session = TRANSPORTS[server.get("transport", "sse")](server)
    try:
        session.open()
        tag_filter = "include_tags" in filters or "exclude_tags" in filters
        if (tag_filter and tool not in {str(t.get("name")) for t in _tools(session, filters)}) or (
            "tools" in filters and tool not in filters["tools"]
        ):
            raise BridgeError(f"unknown tool {tool!r}: `mcp-call SERVER --list` lists the tools", 2)
        result = session.request(1000, "tools/call", {"name": tool, "arguments": arguments})
    finally:
        session.close()
    return render(result), bool(result.get("isError"))


def main(argv: list[str]) -> int:
    """Run the bridge: ``CONFIG --list | CONFIG SERVER --list | CONFIG SERVER TOOL [JSON]``."""
    if len(argv) < 2 or len(argv) > 4:
        print(USAGE, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as file:
        servers: dict[str, dict[str, Any]] = json.load(file)["servers"]
    try:
        if argv[1] == "--list":
            print("\n".join(f"{name} ({server.get('transport')})" for name, server in servers.items()))
            return 0
        if argv[1] not in servers:
            raise BridgeError(f"unknown MCP server {argv[1]!r}; the servers: {', '.join(servers)}", 2)
        if len(argv) == 2 or argv[2] == "--list":
            print(list_tools(servers[argv[1]]))
            return 0
        try:
            arguments = json.loads(argv[3]) if len(argv) == 4 else {}
        except ValueError as exc:
            raise BridgeError(f"the arguments are not JSON: {exc}", 2) from exc
        if not isinstance(arguments, dict):
            raise BridgeError("the arguments must be a JSON object", 2)
        text, failed = call_tool(servers[argv[1]], argv[2], arguments)
    except BridgeError as exc:
        print(f"mcp-call: {exc}", file=sys.stderr)
        return exc.code
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
