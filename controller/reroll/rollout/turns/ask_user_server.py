"""reroll's MCP server offering the ``ask_user`` tool: a stdio JSON-RPC server run in the sandbox
by the agent's MCP client (standard library only: this file is copied into the sandbox as it is
and run by the sandbox's ``python3``).

MCP's stdio transport (modelcontextprotocol.io, "Transports", 2025-06-18): one JSON-RPC 2.0
message per line on stdin and stdout. The server answers ``initialize`` (echoing the client's
protocol version), ``ping``, ``tools/list`` and ``tools/call`` of ``ask_user``; notifications
are ignored; any other method gets -32601. A call's arguments are ``{"question": str,
"options": [str, ...]}`` (options optional); malformed ones get a tool error (``isError``) that
says what is wrong, so the model can correct its call. A valid call is posted to the LLM proxy
(``$REROLL_ASK_URL``, with the rollout token ``$REROLL_ASK_TOKEN``), which holds it until the
controller's User answers (`reroll_contracts.asks`); the answer is the tool's result.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

SERVER_NAME = "reroll"
TOOL = {
    "name": "ask_user",
    "description": (
        "Ask the user a question and wait for the answer. Use it when the task is ambiguous or "
        "under-specified, or a decision is the user's to make. Give `options` when the answer is "
        "one of a few choices; the user answers with one of them (or in their own words without options)."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question for the user."},
            "options": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The answers to choose from (optional).",
            },
        },
        "required": ["question"],
        "additionalProperties": False,
    },
}
ANSWER_TIMEOUT_SECONDS = 24 * 3600.0
"""How long a call waits for the User (the rollout's own timeout ends it sooner)."""


def check_arguments(arguments: Any) -> str | None:
    """Why `arguments` are not a valid ``ask_user`` call, or None when they are."""
    if not isinstance(arguments, dict):
        return "ask_user takes an object {question: string, options?: [string]}"
    unknown = sorted(set(arguments) - {"question", "options"})
    if unknown:
        return f"ask_user: unknown argument(s) {unknown}; it takes question and options"
    question = arguments.get("question")
    if not isinstance(question, str) or not question.strip():
        return "ask_user: `question` must be a non-empty string"
    options = arguments.get("options", [])
    if not isinstance(options, list) or not all(
        isinstance(option, str) and option.strip() for option in options
    ):
        return "ask_user: `options` must be a list of non-empty strings"
    return None


def ask(arguments: dict[str, Any]) -> tuple[str, bool]:
    """Post the question to the proxy; (the answer or the error, whether it is an error)."""
    request = urllib.request.Request(
        os.environ["REROLL_ASK_URL"],
        data=json.dumps(arguments).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["REROLL_ASK_TOKEN"],
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_SECONDS) as response:
            return str(json.load(response)["answer"]), False
    except urllib.error.HTTPError as exc:
        try:
            return str(json.load(exc).get("error", exc)), True
        except ValueError:
            return f"ask_user failed: HTTP {exc.code}", True
    except (OSError, ValueError, KeyError) as exc:
        return f"ask_user failed: {exc}", True


def handle(message: Any) -> dict[str, Any] | None:
    """The response to one JSON-RPC message (None for a notification)."""
    if (
        not isinstance(message, dict)
        or message.get("jsonrpc") != "2.0"
        or not isinstance(message.get("method"), str)
    ):
        return _error(None, -32600, "not a JSON-RPC 2.0 request")
    if "id" not in message:
        return None
    ident, method, params = message["id"], message["method"], message.get("params") or {}
    if method == "initialize":
        version = params.get("protocolVersion", "2025-06-18") if isinstance(params, dict) else "2025-06-18"
        return _result(
            ident,
            {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": SERVER_NAME, "version": "1"},
            },
        )
    if method == "ping":
        return _result(ident, {})
    if method == "tools/list":
        return _result(ident, {"tools": [TOOL]})
    if method == "tools/call":
        if not isinstance(params, dict) or params.get("name") != TOOL["name"]:
            name = params.get("name") if isinstance(params, dict) else None
            return _error(ident, -32602, f"unknown tool {name!r}: this server offers ask_user")
        arguments = params.get("arguments", {})
        problem = check_arguments(arguments)
        text, failed = (problem, True) if problem is not None else ask(arguments)
        return _result(ident, {"content": [{"type": "text", "text": text}], "isError": failed})
    return _error(ident, -32601, f"method {method!r} not found")


def _result(ident: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _error(ident: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}


def main() -> None:
    """Serve stdin until it closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError as exc:
            response: dict[str, Any] | None = _error(None, -32700, f"parse error: {exc}")
        else:
            response = handle(message)
        if response is not None:
            sys.stdout.write(json.dumps(response) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
