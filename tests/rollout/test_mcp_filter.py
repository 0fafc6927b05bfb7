"""reroll's MCP tool filter: which tools it keeps (FastMCP's tag semantics, as BenchFlow passes
them on), and the filter run in front of a real stdio server (a local subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from reroll.rollout.mcp import FILTER_SOURCE
from reroll.rollout.mcp_filter import UNKNOWN_TOOL, Filter, keeps, tool_tags

FILTERS = {"tools": ["read", "archive", "purge"], "include_tags": ["inbox"], "exclude_tags": ["admin"]}


def tool(name: str, *tags: str) -> dict[str, object]:
    return {"name": name, "inputSchema": {"type": "object"}, "_meta": {"_fastmcp": {"tags": list(tags)}}}


def test_each_filter_applies_on_top_of_the_others() -> None:
    assert keeps(FILTERS, "read", {"inbox"})
    assert not keeps(FILTERS, "send", {"inbox"})  # not named in tools
    assert not keeps(FILTERS, "archive", set())  # no included tag
    assert not keeps(FILTERS, "purge", {"inbox", "admin"})  # an excluded tag wins
    assert keeps({"exclude_tags": ["admin"]}, "send", set())
    assert keeps({}, "anything", set())


def test_tags_are_read_from_fastmcps_meta() -> None:
    assert tool_tags(tool("read", "inbox", "mail")) == {"inbox", "mail"}
    assert tool_tags({"name": "bare"}) == set()
    assert tool_tags({"name": "odd", "_meta": {"_fastmcp": {"tags": "inbox"}}}) == set()


def test_a_listing_loses_the_filtered_tools_and_a_call_of_one_is_answered_here() -> None:
    session = Filter(FILTERS)
    assert session.from_client({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) is None
    listed = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"tools": [tool("read", "inbox"), tool("purge", "inbox", "admin")]},
    }
    kept = session.from_server(listed)
    assert [entry["name"] for entry in kept["result"]["tools"]] == ["read"]
    other = {"jsonrpc": "2.0", "id": 2, "result": {"tools": [tool("purge")]}}
    assert session.from_server(other) == other  # not an answer to tools/list: unchanged
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "purge", "arguments": {}}}
    answer = session.from_client(call)
    assert answer == {
        "jsonrpc": "2.0",
        "id": 3,
        "error": {"code": UNKNOWN_TOOL, "message": "Unknown tool: purge"},
    }
    allowed = call | {"params": {"name": "read", "arguments": {}}}
    assert session.from_client(allowed) is None  # goes on to the server
    unlisted = call | {"params": {"name": "send", "arguments": {}}}
    assert session.from_client(unlisted) is not None  # its tags unknown: refused under a tag filter
    assert Filter({"tools": ["send"]}).from_client(unlisted) is None  # a name filter needs no listing


SERVER = textwrap.dedent(
    """
    import json, sys
    tools = [
        {"name": n, "inputSchema": {"type": "object"}, "_meta": {"_fastmcp": {"tags": t}}}
        for n, t in (("read", ["inbox"]), ("send", ["outbox"]), ("purge", ["inbox", "admin"]))
    ]
    for line in sys.stdin:
        m = json.loads(line)
        if "id" not in m:
            continue
        if m["method"] == "tools/list":
            result = {"tools": tools}
        elif m["method"] == "tools/call":
            result = {"content": [{"type": "text", "text": "called " + m["params"]["name"]}]}
        else:
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}}
        print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": result}), flush=True)
    """
)


@pytest.mark.spawns
def test_the_filter_in_front_of_a_stdio_server(tmp_path: Path) -> None:
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    requests: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "purge", "arguments": {}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "read", "arguments": {}}},
    ]
    command = [
        sys.executable,
        str(FILTER_SOURCE),
        json.dumps({"exclude_tags": ["admin"]}),
        sys.executable,
        str(server),
    ]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as running:
        assert running.stdin is not None and running.stdout is not None
        answers = {}
        for request in requests:  # as a client does: each answer before the next request
            running.stdin.write(json.dumps(request) + "\n")
            running.stdin.flush()
            if "id" in request:
                answers[request["id"]] = json.loads(running.stdout.readline())
        running.stdin.close()
        assert running.wait(timeout=30) == 0
    assert answers[1]["result"]["protocolVersion"] == "2025-06-18"
    assert [entry["name"] for entry in answers[2]["result"]["tools"]] == ["read", "send"]
    assert answers[3]["error"]["code"] == UNKNOWN_TOOL
    assert answers[4]["result"]["content"][0]["text"] == "called read"


@pytest.mark.spawns
def test_the_filter_needs_its_filters_and_a_command() -> None:
    done = subprocess.run(
        [sys.executable, str(FILTER_SOURCE), "{}"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "usage: mcp_filter.py" in done.stderr
