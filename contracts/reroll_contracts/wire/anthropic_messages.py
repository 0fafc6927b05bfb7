"""Anthropic Messages: ``POST /v1/messages``, streamed as named events.

A stream is ``message_start``, ``ping`` (any time), per content block ``content_block_start``
/ ``content_block_delta``... / ``content_block_stop``, then ``message_delta`` (stop reason,
output usage) and ``message_stop``. Deltas are ``text_delta``, ``input_json_delta`` (a
``tool_use`` block's input as JSON text in pieces), ``thinking_delta``, ``signature_delta``
and ``citations_delta``. Errors are ``{"type": "error", "error": {"type", "message"}}``.
The upstream wants ``x-api-key`` and ``anthropic-version`` (the agent's own version and beta
headers are passed on; ``2023-06-01`` when it sent none).

Normalisation: ``system`` (a string or text blocks) becomes the first message; ``tool_use``
blocks become ``tool_call`` blocks (``input`` as arguments), ``tool_result`` blocks keep their
content and ``is_error``, ``thinking`` blocks their text; tools are ``name``, ``description``
and ``input_schema`` (as parameters).

Response normalisation: the ``content`` blocks in order (``thinking`` a ``thinking`` block,
``text``, ``tool_use`` a ``tool_call`` with its id and ``input``; ``redacted_thinking`` dropped);
prompt tokens are ``input_tokens`` + ``cache_read_input_tokens`` +
``cache_creation_input_tokens``, of which ``cache_read_input_tokens`` are cached (0 when the
usage has input tokens but no cache fields: caching is opt-in).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire import normal
from reroll_contracts.wire.normal import NormalRequest, NormalResponse
from reroll_contracts.wire.sse import json_payloads, pieces

ANTHROPIC_VERSION = "2023-06-01"
"""Sent upstream as ``anthropic-version`` when the agent sent none."""
_PASSED_ON = ("anthropic-version", "anthropic-beta")
_PROMPT_TOKENS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "text": {"text": ""},
    "thinking": {"thinking": "", "signature": ""},
    "tool_use": {"input": {}},
}


class AnthropicMessages:
    """The Anthropic Messages `reroll_contracts.wire.WireFormat`."""

    name: Final = "anthropic-messages"
    paths = ("/v1/messages", "/messages")
    upstream_path = "/messages"
    conversation_key = "messages"
    terminal_markers = (b"message_stop",)

    def upstream_headers(self, api_key: str | None, agent_headers: Mapping[str, str]) -> dict[str, str]:
        """``x-api-key`` (when a key is configured), ``anthropic-version`` and ``anthropic-beta``."""
        headers = {name: agent_headers[name] for name in _PASSED_ON if name in agent_headers}
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
        return headers | ({"x-api-key": api_key} if api_key else {})

    def error_body(self, kind: str, message: str) -> bytes:
        """``{"type": "error", "error": {"type": kind, "message"}}``."""
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})

    def is_terminal(self, event: SseEvent) -> bool:
        """The ``message_stop`` event."""
        return event.event == "message_stop"

    def assemble(self, events: Iterable[SseEvent]) -> dict[str, Any]:
        """Fold the events into the ``message`` object (``content`` blocks in index order;
        a ``tool_use`` input parsed from its JSON pieces, ``{}`` when there were none)."""
        message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        blocks: dict[int, dict[str, Any]] = {}
        inputs: dict[int, str] = {}
        for payload in json_payloads(events):
            kind, index = payload.get("type"), payload.get("index", 0)
            if kind == "message_start":
                message |= {**(payload.get("message") or {}), "content": []}
            elif kind == "content_block_start":
                blocks[index] = dict(payload.get("content_block") or {})
            elif kind == "content_block_delta":
                _merge_delta(blocks.setdefault(index, {}), inputs, index, payload.get("delta") or {})
            elif kind == "content_block_stop" and index in inputs:
                blocks.setdefault(index, {})["input"] = _parse_input(inputs.pop(index))
            elif kind == "message_delta":
                message |= payload.get("delta") or {}
                message["usage"] = {**(message.get("usage") or {}), **(payload.get("usage") or {})}
        message["content"] = [blocks[index] for index in sorted(blocks)]
        return message

    def to_events(
        self, body: dict[str, Any], request: dict[str, Any], piece_chars: int = 16
    ) -> list[SseEvent]:
        """``message_start``, ``ping``, each block (text, thinking and its signature, tool-use
        input as JSON) in pieces, ``message_delta``, ``message_stop``."""
        usage = body.get("usage") or {}
        start = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = {**usage, "output_tokens": min(1, usage.get("output_tokens", 0))}
        events = [_event("message_start", {"message": start}), _event("ping", {})]
        for index, block in enumerate(body.get("content") or []):
            events += _block_events(index, block, piece_chars)
        stop = {key: body.get(key) for key in ("stop_reason", "stop_sequence")}
        output = {"output_tokens": usage.get("output_tokens", 0)}
        events.append(_event("message_delta", {"delta": stop, "usage": output}))
        return [*events, _event("message_stop", {})]

    def normalise(self, body: dict[str, Any]) -> NormalRequest:
        """See the module docstring."""
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            messages.append(normal.message("system", _normal_content(system)))
        for entry in body.get("messages") or []:
            if isinstance(entry, dict):
                messages.append(normal.message(entry.get("role"), _normal_content(entry.get("content"))))
            else:
                messages.append(normal.message("user", [normal.clean(entry)]))
        tools = body.get("tools")
        return {
            "messages": messages,
            "tools": [_normal_tool(t) for t in tools] if isinstance(tools, list) else [],
            "params": normal.params_of(body, ("system", "messages", "tools")),
        }

    def normalise_response(self, body: dict[str, Any]) -> NormalResponse:
        """See the module docstring."""
        blocks: list[dict[str, Any]] = []
        for block in body.get("content") or []:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                blocks.append(normal.text_block(block.get("text", "")))
            elif kind == "thinking":
                blocks.append({"type": "thinking", "text": str(block.get("thinking", ""))})
            elif kind == "tool_use":
                blocks.append(
                    normal.response_tool_call(block.get("id"), block.get("name"), block.get("input"))
                )
            elif kind != "redacted_thinking" and isinstance(block, dict):
                blocks.append(block)
        usage = body.get("usage")
        return {
            "message": normal.assistant(blocks),
            "usage": _usage(usage) if isinstance(usage, dict) else None,
            "stop_reason": body.get("stop_reason"),
        }


FORMAT = AnthropicMessages()


def _usage(usage: dict[str, Any]) -> normal.NormalUsage:
    counts = [normal.token_count(usage.get(key)) for key in _PROMPT_TOKENS]
    return {
        "prompt_tokens": None if counts[0] is None else sum(count or 0 for count in counts),
        "completion_tokens": normal.token_count(usage.get("output_tokens")),
        "cached_tokens": counts[1] if counts[1] is not None or counts[0] is None else 0,
    }


def _event(kind: str, payload: dict[str, Any]) -> SseEvent:
    return SseEvent(event=kind, data=orjson.dumps({"type": kind, **payload}).decode())


def _block_events(index: int, block: dict[str, Any], piece_chars: int) -> list[SseEvent]:
    kind = block.get("type", "")
    empty = {**block, **_EMPTY_BLOCKS.get(kind, {})}
    events = [_event("content_block_start", {"index": index, "content_block": empty})]
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        deltas = [
            {"type": "text_delta", "text": piece} for piece in pieces(block.get("text", ""), piece_chars)
        ]
    elif kind == "thinking":
        thinking = pieces(block.get("thinking", ""), piece_chars)
        deltas = [{"type": "thinking_delta", "thinking": piece} for piece in thinking]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    elif kind == "tool_use":
        text = orjson.dumps(block.get("input") or {}).decode()
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces(text, piece_chars)]
    events += [_event("content_block_delta", {"index": index, "delta": delta}) for delta in deltas]
    return [*events, _event("content_block_stop", {"index": index})]


def _merge_delta(block: dict[str, Any], inputs: dict[int, str], index: int, delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "input_json_delta":
        inputs[index] = inputs.get(index, "") + delta.get("partial_json", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))


def _parse_input(text: str) -> Any:
    if not text.strip():
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _normal_content(content: Any) -> list[Any]:
    if content is None:
        return []
    if not isinstance(content, list):
        return [normal.text_block(content)]
    return [_normal_block(block) for block in content]


def _normal_block(block: Any) -> Any:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(block, dict):
        return normal.clean(block)
    if kind == "text":
        return normal.text_block(block.get("text", ""))
    if kind == "tool_use":
        return normal.tool_call(block.get("name"), block.get("input"))
    if kind == "tool_result":
        result = {"type": "tool_result", "content": _normal_content(block.get("content"))}
        return result | ({"is_error": True} if block.get("is_error") else {})
    if kind == "thinking":
        return {"type": "thinking", "text": normal.clean(block.get("thinking", ""))}
    if kind == "image":
        return {"type": "image", "source": normal.clean(block.get("source"))}
    return normal.clean(block)


def _normal_tool(definition: Any) -> Any:
    if not isinstance(definition, dict) or "input_schema" not in definition:
        return normal.clean(definition)
    return normal.tool(definition.get("name"), definition.get("description"), definition.get("input_schema"))
