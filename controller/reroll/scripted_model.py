"""The bundled scripted model: a deterministic OpenAI-compatible server that answers from a script.

It needs no network and no key, so the main job runs end to end on a fresh machine. The script
(YAML or JSON) lists one answer per turn::

    turns:
      - content: "I'll list the files."       # optional text
        tool_calls:                           # optional OpenAI function tool calls
          - name: bash
            arguments: {command: "ls"}        # an object (sent JSON-encoded) or a string
        delay_seconds: 0.5                    # optional latency before answering
      - content: "Done."

The turn is chosen by the number of assistant messages already in the request, so the server is
stateless and a continuation that starts at turn k gets turn k. Everything is deterministic:
response id ``chatcmpl-scripted-<turn>``, tool-call ids ``call_<turn>_<j>``, ``created`` fixed
per turn, token counts of about one per four characters. ``POST /v1/chat/completions`` (and
``/chat/completions``) answer with a ``chat.completion`` or, with ``"stream": true``, its chunks
as SSE ending in ``data: [DONE]``. A request past the last turn gets HTTP 400
``script exhausted: turn N of M``. Any token is accepted.

Run it with ``python -m reroll.scripted_model --script FILE [--host H] [--port P] [--ready-file F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reroll_proxy.runtime import base_url_for, run_service, write_ready_file
from reroll_proxy.sse import completion_to_events, encode_event

from reroll.errors import ModelError

CREATED_BASE = 1_700_000_000
"""``created`` of turn k is CREATED_BASE + k (seconds since the epoch)."""
DEFAULT_MODEL = "scripted"
PIECE_CHARS = 8
"""Characters of text or tool-call arguments per streamed chunk."""


class ScriptedToolCall(BaseModel):
    """One function tool call the scripted model makes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """The function name."""
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    """The arguments: an object (JSON-encoded in the response) or a ready JSON string."""


class ScriptedTurn(BaseModel):
    """The model's answer at one turn."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    """The text of the answer (None: no text; then ``content`` is null, or "" without tool calls)."""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    """Function tool calls, in order."""
    delay_seconds: float = Field(default=0.0, ge=0)
    """Latency before the answer starts, in seconds."""


class ModelScript(BaseModel):
    """A scripted model's whole script."""

    model_config = ConfigDict(extra="forbid")

    turns: list[ScriptedTurn] = Field(min_length=1)
    """One answer per turn; turn k answers requests holding k assistant messages."""


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
        raw = orjson.loads(text) if is_json else yaml.safe_load(text)
    except (yaml.YAMLError, orjson.JSONDecodeError) as exc:
        kind = "JSON" if is_json else "YAML"
        raise ModelError(f"{path}: the model script is not valid {kind}:\n{exc}") from exc
    try:
        return ModelScript.model_validate(raw)
    except ValidationError as exc:
        raise ModelError(f"{path}: invalid model script:\n{exc}") from exc


def completion_for(turn: ScriptedTurn, index: int, request: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` object answering `request` with `turn` (number `index`, from 0)."""
    arguments = [
        call.arguments if isinstance(call.arguments, str) else orjson.dumps(call.arguments).decode()
        for call in turn.tool_calls
    ]
    tool_calls = [
        {"id": f"call_{index}_{j}", "type": "function", "function": {"name": call.name, "arguments": text}}
        for j, (call, text) in enumerate(zip(turn.tool_calls, arguments, strict=True))
    ]
    content = turn.content if turn.content is not None or tool_calls else ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    written = (content or "") + "".join(arguments)
    prompt_tokens = len(orjson.dumps(request.get("messages", []))) // 4
    completion_tokens = max(1, len(written) // 4)
    model = request.get("model")
    return {
        "id": f"chatcmpl-scripted-{index}",
        "object": "chat.completion",
        "created": CREATED_BASE + index,
        "model": model if isinstance(model, str) and model else DEFAULT_MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def build_app(script: ModelScript) -> web.Application:
    """The scripted model as an aiohttp application (``POST /v1/chat/completions``)."""

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"request body is not JSON: {exc}")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list):
            return _error(400, "request body needs a 'messages' list")
        index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if index >= len(script.turns):
            return _error(400, f"script exhausted: turn {index + 1} of {len(script.turns)}")
        turn = script.turns[index]
        if turn.delay_seconds:
            await asyncio.sleep(turn.delay_seconds)
        completion = completion_for(turn, index, body)
        if body.get("stream") is not True:
            return web.Response(body=orjson.dumps(completion), content_type="application/json")
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        for event in completion_to_events(completion, piece_chars=PIECE_CHARS, include_usage=include_usage):
            await response.write(encode_event(event))
        await response.write_eof()
        return response

    app = web.Application(client_max_size=256 * 1024 * 1024)
    for path in ("/v1/chat/completions", "/chat/completions"):
        app.router.add_post(path, chat)
    return app


def _error(status: int, message: str) -> web.Response:
    payload = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")


async def serve(
    script_path: Path, host: str = "127.0.0.1", port: int = 0, ready_file: Path | None = None
) -> None:
    """Serve the script at `script_path` until cancelled.

    Args:
        script_path: the script file.
        host: interface to listen on.
        port: TCP port; 0 picks a free one.
        ready_file: where to write ``{"port", "pid", "base_url"}`` once listening.

    Raises:
        ModelError: the script is missing or invalid.
        OSError: the port cannot be bound.
    """
    app = build_app(load_script(script_path))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = int(runner.addresses[0][1])
        if ready_file is not None:
            write_ready_file(ready_file, host, bound)
        print(f"scripted model ({script_path}) on {base_url_for(host, bound)}", file=sys.stderr, flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """``python -m reroll.scripted_model``: serve until SIGTERM / SIGINT.

    Returns:
        0 after a signal, 2 when the script is invalid.
    """
    parser = argparse.ArgumentParser(
        prog="python -m reroll.scripted_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--script", type=Path, required=True, help="the script file (YAML or JSON)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 picks a free one)")
    parser.add_argument(
        "--ready-file", type=Path, help='written with {"port", "pid", "base_url"} once listening'
    )
    args = parser.parse_args(argv)
    try:
        run_service(lambda: serve(args.script, args.host, args.port, args.ready_file))
    except ModelError as exc:
        print(f"scripted model: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
