"""The bundled scripted model: a deterministic server that answers from a script in three APIs.

It needs no network and no key, so the main job runs end to end on a fresh machine. The script
(YAML or JSON) lists one answer per turn::

    turns:
      - content: "I'll list the files."       # optional text
        tool_calls:                           # optional OpenAI function tool calls
          - name: bash
            arguments: {command: "ls"}        # an object (sent JSON-encoded) or a string
            namespace: mcp__mail              # optional tool group (Responses; elsewhere mcp__mail__NAME)
        thinking: "Look first."               # optional reasoning
        delay_seconds: 0.5                    # optional latency before answering
        errors: [{status: 500}]               # optional: errors before the answer, one per request
      - content: "Done."
    threads:                                  # optional: conversations other than the main one
      - name: title                           # [a-z][a-z0-9_]*, part of the answers' ids
        match: {without_tools: true, system: "(?i)title"}
        turns: [{content: "Fix the failing test"}]

A request is answered by the first thread whose ``match`` it satisfies (every condition given:
`ThreadMatch`), else by ``turns``: one script serves an agent's side calls (titles, commit
messages, summaries) and its subagents. Within the thread, the turn is chosen by the number of
assistant turns already in the request (see `reroll_proxy.scripted_answers`), so a continuation that
starts at turn k gets turn k; the server keeps no state but how many requests each turn got (for
``errors``). ``count: own`` (top level for ``turns``, or per thread) counts only the assistant
messages whose text is one of that thread's scripted ``content``s: for agents that put example
exchanges of their own before the conversation (aider's few-shot SEARCH/REPLACE examples). Everything is
deterministic: ids per turn, ``created`` fixed per turn, token counts of about one per four
characters. ``POST /v1/chat/completions``, ``/v1/responses`` and ``/v1/messages`` (each also
without ``/v1``) answer in their API's shape, or with ``"stream": true`` as that API's SSE
events (``--only-format NAME`` serves one API only, the others answering 404: how a test makes
sure a translating proxy spoke the right one). ``POST /v1/messages/count_tokens`` answers the
count its answers' ``usage`` would give (`reroll_proxy.scripted_answers.count_prompt_tokens`).
A request past the last turn gets HTTP 400
``script exhausted: turn N of M``. Any token is accepted.

Run it with ``python -m reroll_proxy.scripted --script FILE [--host H] [--port P] [--ready-file F]``;
the shared LLM proxy (``python -m reroll_proxy --shared``) serves any number of scripts in its own
process, each added with a `ScriptRegistration` on its admin channel (`SharedScripts`): how every
rollout of a ``reroll`` command shares one (`reroll.models.spec.live_upstream`), without a process
of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import secrets
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import yaml
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from reroll_contracts.errors import ModelError, RequestShapeError
from reroll_contracts.scripted_admin import SCRIPTS_ROUTE, ScriptAdded, ScriptRegistration
from reroll_contracts.service import base_url_for, run_service, write_ready_file
from reroll_contracts.wire import WireFormat, all_formats, format_named
from reroll_contracts.wire.normal import NormalRequest
from reroll_contracts.wire.sse import encode_event
from reroll_contracts.yamltext import safe_load

from reroll_proxy import messages
from reroll_proxy.scripted_answers import Answer, ToolCall, answer_body, count_prompt_tokens, turn_index

if TYPE_CHECKING:
    from reroll_proxy.front import RouteDef

PIECE_CHARS = 8
"""Characters of text or tool-call arguments per streamed chunk."""
MAX_REQUEST_BYTES = 256 * 1024 * 1024
"""The largest request body it reads."""
_ANTHROPIC = format_named("anthropic-messages")


class ScriptedToolCall(BaseModel):
    """One function tool call the scripted model makes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The function name."""
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """The arguments: an object (JSON-encoded in the response) or a ready JSON string."""
    namespace: str | None = Field(default=None, min_length=1)
    """The tool group of the function (`reroll_proxy.scripted_answers.ToolCall.namespace`):
    Codex's MCP tools are ``name: list_messages`` in ``namespace: mcp__mail``."""


class ScriptedError(BaseModel):
    """An error the scripted model answers with instead of its turn (once)."""

    model_config = ConfigDict(extra="forbid")

    status: int = Field(ge=400, le=599)
    """The HTTP status, e.g. 429 or 500."""
    message: str = "scripted error"
    """The error message, in the format's error body."""
    kind: str = "api_error"
    """The error type in the body (``error.type``)."""
    retry_after_seconds: float = Field(default=0.01, gt=0, le=60)
    """Sent as the ``retry-after-ms`` header, which the OpenAI and Anthropic SDKs honour."""


class ScriptedTurn(BaseModel):
    """The model's answer at one turn."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    """The text of the answer (None: no text; then ``content`` is null, or "" without tool calls)."""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    """Function tool calls, in order."""
    thinking: str | None = None
    """Reasoning text: an Anthropic ``thinking`` block, a Responses ``reasoning`` item, Chat
    ``reasoning_content``."""
    errors: list[ScriptedError] = Field(default_factory=list)
    """Errors answered, one per request, to the first requests for this turn (per API format),
    before the answer: how an SDK's retries are exercised."""
    delay_seconds: float = Field(default=0.0, ge=0)
    """Latency before the answer (or error) starts, in seconds."""


class ThreadMatch(BaseModel):
    """Which requests a script thread answers: every condition given must hold (none: all).

    Texts are those of the request normalised to `reroll_contracts.wire.normal.NormalRequest`
    (the same for all three API formats); the patterns are Python regular expressions,
    searched (not anchored).
    """

    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(default_factory=list)
    """Tool names that must all be offered (function tools, by name)."""
    without_tools: bool = False
    """True: the request offers no tools at all."""
    system: str | None = None
    """A pattern searched in the system prompt (``system``, ``instructions``, system messages)."""
    first_user: str | None = None
    """A pattern searched in the first user message's text."""
    last_message: str | None = None
    """A pattern searched in the last message's text (tool results included)."""
    model: str | None = None
    """A pattern searched in the request's ``model``."""

    @field_validator("system", "first_user", "last_message", "model")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from exc
        return pattern

    def matches(self, request: NormalRequest, model: str) -> bool:
        """Whether the request (normalised, and its ``model``) satisfies every condition."""
        offered = {tool.get("name") for tool in request["tools"] if isinstance(tool, dict)}
        messages = request["messages"]
        users = [m for m in messages if m.get("role") == "user"]
        texts = {
            "system": "\n".join(_text(m) for m in messages if m.get("role") == "system"),
            "first_user": _text(users[0]) if users else "",
            "last_message": _text(messages[-1]) if messages else "",
            "model": model,
        }
        patterns = {"system": self.system, "first_user": self.first_user}
        patterns |= {"last_message": self.last_message, "model": self.model}
        return (
            set(self.tools) <= offered
            and not (self.without_tools and request["tools"])
            and all(
                re.search(pattern, texts[where]) for where, pattern in patterns.items() if pattern is not None
            )
        )


def _text(message: dict[str, Any]) -> str:
    """A normalised message's text: its text blocks and tool results, one per line."""
    return _blocks_text(message.get("content", []))


def _blocks_text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    parts: list[str] = []
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            parts.append(_blocks_text(block.get("content")))
    return "\n".join(parts)


TurnCount = Literal["assistant", "own"]
"""How a thread's turn is counted: every assistant turn in the request (``assistant``), or only
the assistant messages whose text is one of the thread's scripted contents (``own``)."""


def own_turns(request: NormalRequest, turns: list[ScriptedTurn]) -> int:
    """The number of assistant messages in `request` whose text (stripped) is the ``content`` of
    one of `turns`: the turns of this script already answered, whatever else the agent put
    among its messages."""
    contents = {turn.content.strip() for turn in turns if turn.content}
    assistants = (m for m in request["messages"] if m.get("role") == "assistant")
    return sum(1 for message in assistants if _text(message).strip() in contents)


class ScriptedThread(BaseModel):
    """A conversation of the script other than the main one: a side call or a subagent."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    """Names the thread in logs and in the answers' ids."""
    match: ThreadMatch
    """Which requests it answers."""
    turns: list[ScriptedTurn] = Field(min_length=1)
    """Its answers, by turn as for the main conversation."""
    count: TurnCount = "assistant"
    """How its turn is counted (`TurnCount`)."""


class ModelScript(BaseModel):
    """A scripted model's whole script."""

    model_config = ConfigDict(extra="forbid")

    turns: list[ScriptedTurn] = Field(min_length=1)
    """One answer per turn of the main conversation; turn k answers requests holding k assistant
    messages."""
    threads: list[ScriptedThread] = Field(default_factory=list)
    """Other conversations, tried in order before the main one (see the module docstring)."""
    count: TurnCount = "assistant"
    """How the main conversation's turn is counted (`TurnCount`)."""

    def thread_for(self, request: NormalRequest, model: str) -> tuple[str, list[ScriptedTurn], TurnCount]:
        """The name ("" for the main conversation), turns and turn count of the thread answering
        `request`."""
        for thread in self.threads:
            if thread.match.matches(request, model):
                return thread.name, thread.turns, thread.count
        return "", self.turns, self.count


def load_script(path: Path) -> ModelScript:
    """Load a script file: JSON when its name ends in ``.json``, YAML otherwise.

    Raises:
        ModelError: the file is missing, not YAML / JSON, or not a valid script; the message names it.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read the model script ({exc})") from exc
    is_json = path.suffix == ".json"
    try:
        raw = orjson.loads(text) if is_json else safe_load(text)
    except (yaml.YAMLError, orjson.JSONDecodeError) as exc:
        kind = "JSON" if is_json else "YAML"
        raise ModelError(f"{path}: the model script is not valid {kind}:\n{exc}") from exc
    try:
        return ModelScript.model_validate(raw)
    except ValidationError as exc:
        raise ModelError(f"{path}: invalid model script:\n{exc}") from exc


def answer_for(turn: ScriptedTurn, index: int, thread: str = "") -> Answer:
    """The format-neutral answer of `turn` (number `index`, from 0, of `thread`)."""
    calls = [
        ToolCall(
            call.name,
            call.arguments if isinstance(call.arguments, str) else orjson.dumps(call.arguments).decode(),
            call.namespace,
        )
        for call in turn.tool_calls
    ]
    return Answer(index=index, content=turn.content, tool_calls=calls, thinking=turn.thinking, thread=thread)


class ScriptServer:
    """The handlers of one script (see the module docstring).

    Args:
        script: the script.
        only_format: serve only this API format (the others answer 404); None serves all.

    Raises:
        KeyError: `only_format` names no format.
    """

    def __init__(self, script: ModelScript, only_format: str | None = None) -> None:
        self.script = script
        self.served = [format_named(only_format)] if only_format else all_formats()
        self._requests_per_turn: Counter[tuple[str, str, int]] = Counter()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Route its API paths on `router`."""
        for wire in self.served:
            for path in wire.paths:
                router.add_post(path, functools.partial(self.serve_turn, wire))
            if wire is _ANTHROPIC:
                for path in wire.paths:
                    router.add_post(path + "/count_tokens", self.count_tokens)

    async def serve_turn(self, wire: WireFormat, request: web.Request) -> web.StreamResponse:
        """Answer `request` (in `wire`'s format) with its turn of the script."""
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise RequestShapeError("request body must be a JSON object")
            index = turn_index(wire.name, body)
            model = body.get("model")
            normal = wire.normalise(body)
            thread, turns, count = self.script.thread_for(normal, model if isinstance(model, str) else "")
            if count == "own":
                index = own_turns(normal, turns)
        except (orjson.JSONDecodeError, RequestShapeError) as exc:
            return _error(wire, 400, "invalid_request_error", f"bad request: {exc}")
        if index >= len(turns):
            where = f" of thread {thread!r}" if thread else ""
            message = f"script exhausted: turn {index + 1} of {len(turns)}{where}"
            return _error(wire, 400, "invalid_request_error", message)
        turn = turns[index]
        seen = self._requests_per_turn[wire.name, thread, index]
        self._requests_per_turn[wire.name, thread, index] += 1
        if turn.delay_seconds:
            await asyncio.sleep(turn.delay_seconds)
        if seen < len(turn.errors):
            failure = turn.errors[seen]
            headers = {"retry-after-ms": str(round(failure.retry_after_seconds * 1000))}
            return _error(wire, failure.status, failure.kind, failure.message, headers)
        answer = answer_body(wire.name, answer_for(turn, index, thread), body)
        if body.get("stream") is not True:
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        for event in wire.to_events(answer, body, piece_chars=PIECE_CHARS):
            await response.write(encode_event(event))
        await response.write_eof()
        return response

    async def count_tokens(self, request: web.Request) -> web.Response:
        """``POST …/messages/count_tokens``: the count its answers' ``usage`` would give."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(_ANTHROPIC, 400, "invalid_request_error", f"bad request: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(_ANTHROPIC, 400, "invalid_request_error", "count_tokens needs a 'messages' list")
        return web.json_response({"input_tokens": count_prompt_tokens(body)})


def build_app(script: ModelScript, only_format: str | None = None) -> web.Application:
    """The scripted model serving one script as an aiohttp application (see `ScriptServer`).

    Raises:
        KeyError: `only_format` names no format.
    """
    app = web.Application(client_max_size=MAX_REQUEST_BYTES)
    ScriptServer(script, only_format).add_routes(app.router)
    return app


class SharedScripts:
    """A scripted model serving any number of scripts, each under its own path prefix
    (``/<script_id>/v1/chat/completions`` …) on a site of its own (`start`), added and removed on
    `SCRIPTS_ROUTE` (`admin_routes`), which the shared proxy's control site serves behind its admin
    token (`reroll_proxy.host.ProxyHost`): nothing that reaches its port can make it read a file. A
    script that does not load is refused alone (400, the cause in the body).
    """

    def __init__(self) -> None:
        self._scripts: dict[str, ScriptServer] = {}
        self.base_url = ""
        """Its own base URL (set once listening); each script's is below it."""
        self.app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        for wire in all_formats():
            for path in wire.paths:
                self.app.router.add_post("/{script_id}" + path, functools.partial(self._serve, wire))
        for path in _ANTHROPIC.paths:
            self.app.router.add_post("/{script_id}" + path + "/count_tokens", self._count_tokens)
        self._runner: web.AppRunner | None = None

    def admin_routes(self) -> list[RouteDef]:
        """Its admin routes, for the proxy's own server (`reroll_proxy.front`): ``POST SCRIPTS_ROUTE``
        (a `ScriptRegistration`, answered with a `ScriptAdded`), ``DELETE SCRIPTS_ROUTE/{script_id}``;
        whoever serves them checks the caller."""
        return [("POST", SCRIPTS_ROUTE, self._add), ("DELETE", SCRIPTS_ROUTE + "/{script_id}", self._remove)]

    async def start(self, host: str) -> None:
        """Listen on (`host`, a free port) and set `base_url`.

        Raises:
            OSError: the address cannot be bound.
        """
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, 0).start()
        except BaseException:
            await self.stop()
            raise
        self.base_url = base_url_for(host, int(self._runner.addresses[0][1]))

    async def stop(self) -> None:
        """Stop listening (nothing when it does not)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def _server(self, request: web.Request, wire: WireFormat) -> ScriptServer | None:
        server = self._scripts.get(request.match_info["script_id"])
        return server if server is not None and wire in server.served else None

    async def _serve(self, wire: WireFormat, request: web.Request) -> web.StreamResponse:
        server = self._server(request, wire)
        if server is None:
            return _error(wire, 404, "not_found_error", f"no script serves {request.path}")
        return await server.serve_turn(wire, request)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        server = self._server(request, _ANTHROPIC)
        if server is None:
            return _error(_ANTHROPIC, 404, "not_found_error", f"no script serves {request.path}")
        return await server.count_tokens(request)

    async def _add(self, request: messages.Request) -> messages.Response:
        try:
            registration = ScriptRegistration.model_validate_json(await request.read())
            server = ScriptServer(load_script(registration.script), registration.only_format)
        except (ValidationError, ModelError) as exc:
            return messages.json_response({"error": str(exc)}, status=400)
        script_id = secrets.token_hex(8)
        self._scripts[script_id] = server
        added = ScriptAdded(
            script_id=script_id, base_url=self.base_url.removesuffix("/v1") + f"/{script_id}/v1"
        )
        return messages.Response(body=added.model_dump_json(), content_type="application/json")

    async def _remove(self, request: messages.Request) -> messages.Response:
        self._scripts.pop(request.match_info["script_id"], None)
        return messages.Response(status=204)


def _error(
    wire: WireFormat, status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = wire.error_body(kind, message)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


async def serve(
    script_path: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    ready_file: Path | None = None,
    only_format: str | None = None,
) -> None:
    """Serve the script at `script_path` until cancelled.

    Args:
        script_path: the script file.
        host: interface to listen on.
        port: TCP port; 0 picks a free one.
        ready_file: where to write the `reroll_contracts.proxy.ReadyFile` once listening.
        only_format: serve only this API format (see `build_app`).

    Raises:
        ModelError: the script is missing or invalid.
        OSError: the port cannot be bound.
    """
    app = build_app(load_script(script_path), only_format)
    await _listen(app, host, port, ready_file, f"scripted model ({script_path})")


async def _listen(
    app: web.Application,
    host: str,
    port: int,
    ready_file: Path | None,
    what: str,
) -> None:
    """Run `app` on (`host`, `port`) until cancelled; write the ready file once listening."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        if ready_file is not None:
            write_ready_file(ready_file, host, bound)
        print(f"{what} on {base_url_for(host, bound)}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """``python -m reroll_proxy.scripted``: serve until SIGTERM / SIGINT.

    Returns:
        0 after a signal, 2 when the script is invalid.
    """
    parser = argparse.ArgumentParser(
        prog="python -m reroll_proxy.scripted", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--script", type=Path, required=True, help="the script file (YAML or JSON)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 picks a free one)")
    parser.add_argument("--ready-file", type=Path, help='written with {"pid", "address"} once listening')
    parser.add_argument(
        "--only-format",
        choices=[wire.name for wire in all_formats()],
        help="serve only this API format's paths (the others answer 404)",
    )
    args = parser.parse_args(argv)
    try:
        run_service(lambda: serve(args.script, args.host, args.port, args.ready_file, args.only_format))
    except ModelError as exc:
        print(f"scripted model: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
