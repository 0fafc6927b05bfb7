"""reroll's MCP tool filter: a stdio MCP server that starts the task's own stdio server and passes
every message through, except that it offers only the tools the task's filters keep (standard
library only: this file is copied into the sandbox as it is and run by the sandbox's ``python3``).

It is the layer `reroll.rollout.mcp` puts in front of a stdio server whose filters the agent's
native MCP configuration cannot say (Claude Code's says none of them). Usage::

    python3 mcp_filter.py '{"tools": [...], "include_tags": [...], "exclude_tags": [...]}' CMD ARG...

The filters (each optional, all applying together, FastMCP's semantics as BenchFlow passes them
on): ``tools`` keeps only the tools so named; ``include_tags`` keeps only the tools tagged with at
least one of them; ``exclude_tags`` drops every tool tagged with one of them. A tool's tags are
FastMCP's, which its servers list in the tool's ``_meta._fastmcp.tags``; a tool without tags
has none (so ``include_tags`` drops it).

MCP's stdio transport: one JSON-RPC 2.0 message per line. The answers to ``tools/list`` lose the
tools that are filtered out; a ``tools/call`` of one is answered here with error -32602 (unknown
tool) and never reaches the server, as is a call of a tool the server has not listed through the
filter yet when a tag filter applies (its tags are unknown). Everything else, both ways, is
passed on unchanged; the server's stderr is this process's; its exit status is this process's.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from typing import IO, Any

UNKNOWN_TOOL = -32602
"""The JSON-RPC error of a call to a tool that is filtered out (MCP's "Unknown tool" code)."""


def tool_tags(tool: dict[str, Any]) -> set[str]:
    """The FastMCP tags of a ``tools/list`` entry (``_meta._fastmcp.tags``); none when it has none."""
    meta = tool.get("_meta")
    fastmcp = meta.get("_fastmcp") if isinstance(meta, dict) else None
    tags = fastmcp.get("tags") if isinstance(fastmcp, dict) else None
    return {tag for tag in tags if isinstance(tag, str)} if isinstance(tags, list) else set()


def keeps(filters: dict[str, list[str]], name: str, tags: set[str]) -> bool:
    """Whether `filters` (``tools``, ``include_tags``, ``exclude_tags``, each optional) offer the
    tool `name` tagged `tags`."""
    if "tools" in filters and name not in filters["tools"]:
        return False
    if "include_tags" in filters and not tags & set(filters["include_tags"]):
        return False
    return not tags & set(filters.get("exclude_tags", []))


class Filter:
    """One client's session through the filter: which requests were ``tools/list`` (their
    answers to filter) and which tools the server listed (their tags, for calls)."""

    def __init__(self, filters: dict[str, list[str]]) -> None:
        self.filters = filters
        self.listing: set[Any] = set()  # ids of the tools/list requests not yet answered
        self.tags: dict[str, set[str]] = {}  # every tool the server listed, by name
        self.lock = threading.Lock()

    def from_client(self, message: Any) -> Any | None:
        """None when `message` goes on to the server unchanged; else the answer to send back
        to the client instead (a call of a filtered-out tool)."""
        if not isinstance(message, dict):
            return None
        method = message.get("method")
        if method == "tools/list" and "id" in message:
            with self.lock:
                self.listing.add(message["id"])
        if method == "tools/call" and "id" in message:
            params = message.get("params")
            name = params.get("name") if isinstance(params, dict) else None
            with self.lock:
                tags = self.tags.get(str(name))
            unknown = tags is None and ("include_tags" in self.filters or "exclude_tags" in self.filters)
            if not isinstance(name, str) or unknown or not keeps(self.filters, name, tags or set()):
                error = {"code": UNKNOWN_TOOL, "message": f"Unknown tool: {name}"}
                return {"jsonrpc": "2.0", "id": message["id"], "error": error}
        return None

    def from_server(self, message: Any) -> Any:
        """`message` as the client gets it: an answer to ``tools/list`` without the tools that
        are filtered out; anything else unchanged."""
        if not isinstance(message, dict) or "method" in message or "id" not in message:
            return message
        with self.lock:
            if message["id"] not in self.listing:
                return message
            self.listing.discard(message["id"])
        result = message.get("result")
        if not isinstance(result, dict) or not isinstance(tools := result.get("tools"), list):
            return message
        kept = []
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                continue
            tags = tool_tags(tool)
            with self.lock:
                self.tags[name] = tags
            if keeps(self.filters, name, tags):
                kept.append(tool)
        return message | {"result": result | {"tools": kept}}


def _write(out: IO[str], lock: threading.Lock, message: Any) -> None:
    with lock:
        out.write(json.dumps(message) + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    """Run the filter in front of the server ``argv[1:]`` with the filters ``argv[0]`` (JSON);
    its exit status is the server's (2 for a bad command line)."""
    if len(argv) < 2:
        print("usage: mcp_filter.py FILTERS_JSON COMMAND [ARG...]", file=sys.stderr)
        return 2
    session = Filter(json.loads(argv[0]))
    server = subprocess.Popen(argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    to_client = threading.Lock()

    def pump_server() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            try:
                message = session.from_server(json.loads(line))
            except ValueError:
                with to_client:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                continue
            _write(sys.stdout, to_client, message)

    pumping = threading.Thread(target=pump_server, daemon=True)
    pumping.start()
    with contextlib.suppress(BrokenPipeError):  # the server is gone: its exit status tells
        for line in sys.stdin:
            try:
                answer = session.from_client(json.loads(line))
            except ValueError:
                answer = None
            if answer is not None:
                _write(sys.stdout, to_client, answer)
                continue
            server.stdin.write(line)
            server.stdin.flush()
    with contextlib.suppress(BrokenPipeError):
        server.stdin.close()
    code = server.wait()
    pumping.join()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
