"""The mail-and-calendar service's operations as MCP tools, over stdio (Python's standard library
only: the agent starts it with the sandbox's ``python3``).

    python3 mcp_server.py [--url http://localhost:9001]

The Model Context Protocol's stdio transport (modelcontextprotocol.io, specification 2025-06-18):
JSON-RPC 2.0 messages, one per line, on stdin and stdout; the server answers ``initialize``,
``ping``, ``tools/list`` and ``tools/call``, ignores notifications, and answers any other method
with error -32601. Each tool is one HTTP call to the service (`service.py`); a refusal of the
service (400, 404, 409) is a tool result with ``isError: true`` and its message, so the model sees it.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

SERVER_INFO = {"name": "mail", "version": "1.0.0"}
LATEST_PROTOCOL = "2025-06-18"

ID = {"type": "integer", "description": "The message's id (from list_messages)."}
TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_messages",
        "description": "List the messages of a mail folder (id, sender, subject, time; no bodies).",
        "inputSchema": {
            "type": "object",
            "properties": {"folder": {"type": "string", "enum": ["inbox", "archive", "sent", "all"],
                                      "description": "The folder [default: inbox]."}},
        },
    },
    {
        "name": "read_message",
        "description": "Read one message, with its body.",
        "inputSchema": {"type": "object", "properties": {"id": ID}, "required": ["id"]},
    },
    {
        "name": "archive_message",
        "description": "Move a message to the archive folder.",
        "inputSchema": {"type": "object", "properties": {"id": ID}, "required": ["id"]},
    },
    {
        "name": "reply_to_message",
        "description": "Send a reply to a message's sender (subject 'Re: ...').",
        "inputSchema": {
            "type": "object",
            "properties": {"id": ID, "body": {"type": "string", "description": "The reply's text."}},
            "required": ["id", "body"],
        },
    },
    {
        "name": "list_events",
        "description": "List the calendar's events starting on a day, by start time.",
        "inputSchema": {
            "type": "object",
            "properties": {"date": {"type": "string", "description": "The day, YYYY-MM-DD."}},
            "required": ["date"],
        },
    },
    {
        "name": "book_event",
        "description": "Book a calendar event; refused when it overlaps another event.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "start": {"type": "string", "description": "Start time, YYYY-MM-DDTHH:MM."},
                "end": {"type": "string", "description": "End time, YYYY-MM-DDTHH:MM."},
                "attendees": {"type": "array", "items": {"type": "string"},
                              "description": "E-mail addresses of the attendees."},
            },
            "required": ["title", "start", "end"],
        },
    },
]  # fmt: skip


def call_tool(base_url: str, name: str, arguments: dict[str, Any]) -> tuple[Any, bool]:
    """Run tool `name` against the service at `base_url`: (its result, whether it is an error)."""
    if name == "list_messages":
        request = ("GET", f"/messages?folder={quote(str(arguments.get('folder', 'inbox')))}", None)
    elif name == "read_message":
        request = ("GET", f"/messages/{int(arguments['id'])}", None)
    elif name == "archive_message":
        request = ("POST", f"/messages/{int(arguments['id'])}/archive", {})
    elif name == "reply_to_message":
        request = ("POST", f"/messages/{int(arguments['id'])}/reply", {"body": arguments.get("body")})
    elif name == "list_events":
        request = ("GET", f"/events?date={quote(str(arguments['date']))}", None)
    elif name == "book_event":
        fields = ("title", "start", "end", "attendees")
        request = ("POST", "/events", {key: arguments[key] for key in fields if key in arguments})
    else:
        return f"unknown tool {name!r}", True
    method, path, body = request
    data = None if body is None else json.dumps(body).encode()
    http = urllib.request.Request(
        base_url.rstrip("/") + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(http, timeout=30) as response:
            return json.loads(response.read()), False
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read()).get("error", str(exc)), True
        except (json.JSONDecodeError, AttributeError):
            return str(exc), True


def handle(base_url: str, message: dict[str, Any]) -> dict[str, Any] | None:
    """The response to one JSON-RPC message (None for a notification)."""
    method, params = message.get("method"), message.get("params") or {}
    if "id" not in message:
        return None
    reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
    if method == "initialize":
        reply["result"] = {
            "protocolVersion": params.get("protocolVersion", LATEST_PROTOCOL),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
        }
    elif method == "ping":
        reply["result"] = {}
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call":
        try:
            result, is_error = call_tool(base_url, params.get("name", ""), params.get("arguments") or {})
        except (KeyError, ValueError, TypeError) as exc:
            result, is_error = f"invalid arguments: {exc}", True
        except OSError as exc:
            result, is_error = f"the mail service is unreachable: {exc}", True
        text = result if isinstance(result, str) else json.dumps(result, indent=1)
        reply["result"] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    else:
        reply["error"] = {"code": -32601, "message": f"method not found: {method}"}
    return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://localhost:9001", help="the mail service")
    args = parser.parse_args()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            response: dict[str, Any] | None = {
                "jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": f"parse error: {exc}"}
            }  # fmt: skip
        else:
            response = handle(args.url, message) if isinstance(message, dict) else None
        if response is not None:
            sys.stdout.write(json.dumps(response) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
