"""OpenAI Responses: ``POST /v1/responses``, streamed as named events with a ``sequence_number``.

A stream is ``response.created``, ``response.in_progress``, per output item
``response.output_item.added`` ... ``response.output_item.done`` (a message's text through
``response.content_part.added`` / ``response.output_text.delta`` / ``.done`` /
``response.content_part.done``; a function call's arguments through
``response.function_call_arguments.delta`` / ``.done``; a reasoning summary through
``response.reasoning_summary_part.added`` / ``response.reasoning_summary_text.delta`` ...),
and a last ``response.completed`` (or ``.incomplete`` / ``.failed``) carrying the whole
response. Errors and auth are OpenAI's (see `reroll_contracts.wire.openai_chat`).

Normalisation: ``instructions`` becomes the first message; ``input`` (a string, or a list of
items) gives one message per item: ``message`` items by role, ``function_call`` an assistant
``tool_call``, ``function_call_output`` a ``tool`` message, ``reasoning`` an assistant
``thinking`` block (its summary texts); tools are the flat ``function`` definitions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import orjson

from reroll_contracts.trajectory import SseEvent
from reroll_contracts.wire import normal
from reroll_contracts.wire.normal import NormalRequest, NormalResponse
from reroll_contracts.wire.openai_chat import OpenAIAuthAndErrors
from reroll_contracts.wire.sse import json_payloads, pieces

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
"""Events that end a Responses stream."""
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text"})


class OpenAIResponses(OpenAIAuthAndErrors):
    """The OpenAI Responses `reroll_contracts.wire.WireFormat`."""

    name: Final = "openai-responses"
    paths = ("/v1/responses", "/responses")
    upstream_path = "/responses"
    conversation_key = "input"
    terminal_markers = tuple(sorted(name.encode() for name in TERMINAL_EVENTS))

    def is_terminal(self, event: SseEvent) -> bool:
        """One of `TERMINAL_EVENTS`."""
        return event.event in TERMINAL_EVENTS

    def assemble(self, events: Iterable[SseEvent]) -> dict[str, Any]:
        """The last ``response`` object the events carried (the ``response.completed`` one);
        when it has no output (a stream cut short), the items of ``response.output_item.done``."""
        response: dict[str, Any] = {"object": "response", "output": []}
        items: dict[int, Any] = {}
        for payload in json_payloads(events):
            if isinstance(payload.get("response"), dict):
                response = dict(payload["response"])
            elif payload.get("type") == "response.output_item.done":
                items[payload.get("output_index", len(items))] = payload.get("item")
        if not response.get("output") and items:
            response["output"] = [items[index] for index in sorted(items)]
        return response

    def to_events(
        self, body: dict[str, Any], request: dict[str, Any], piece_chars: int = 16
    ) -> list[SseEvent]:
        """The events OpenAI streams for `body` (see the module docstring), numbered from 0."""
        pending = {**body, "status": "in_progress", "output": [], "usage": None}
        payloads: list[dict[str, Any]] = [
            {"type": "response.created", "response": pending},
            {"type": "response.in_progress", "response": pending},
        ]
        for index, item in enumerate(body.get("output") or []):
            payloads += _item_payloads(index, item, max(1, piece_chars))
        status = body.get("status")
        last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(str(status))
        payloads.append({"type": last or "response.completed", "response": body})
        return [
            SseEvent(event=p["type"], data=orjson.dumps({**p, "sequence_number": n}).decode())
            for n, p in enumerate(payloads)
        ]

    def normalise(self, body: dict[str, Any]) -> NormalRequest:
        """See the module docstring."""
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append(normal.message("system", [normal.text_block(body["instructions"])]))
        given = body.get("input")
        if isinstance(given, str):
            messages.append(normal.message("user", [normal.text_block(given)]))
        elif isinstance(given, list):
            messages += [_normal_item(item) for item in given]
        tools = body.get("tools")
        return {
            "messages": messages,
            "tools": [_normal_tool(t) for t in tools] if isinstance(tools, list) else [],
            "params": normal.params_of(body, ("instructions", "input", "tools")),
        }

    def normalise_response(self, body: dict[str, Any]) -> NormalResponse:
        """See the module docstring."""
        blocks: list[dict[str, Any]] = []
        for item in body.get("output") or []:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "reasoning":
                summary = "".join(str(part.get("text", "")) for part in item.get("summary") or [])
                blocks.append({"type": "thinking", "text": summary})
            elif kind == "message":
                blocks += [
                    normal.text_block(part.get("text", "")) if part.get("type") in _TEXT_PARTS else part
                    for part in item.get("content") or []
                    if isinstance(part, dict)
                ]
            elif kind == "function_call":
                blocks.append(
                    normal.response_tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
                )
        cut = (body.get("incomplete_details") or {}).get("reason")
        return {
            "message": normal.assistant(blocks),
            "usage": normal.openai_usage(
                body.get("usage"), "input_tokens", "output_tokens", "input_tokens_details"
            ),
            "stop_reason": cut or body.get("status"),
        }


FORMAT = OpenAIResponses()


def _item_payloads(index: int, item: dict[str, Any], piece_chars: int) -> list[dict[str, Any]]:
    kind = item.get("type")
    at = {"item_id": item.get("id"), "output_index": index}
    payloads: list[dict[str, Any]] = []
    if kind == "message":
        added = {**item, "status": "in_progress", "content": []}
        for number, part in enumerate(item.get("content") or []):
            payloads += _part_payloads(at | {"content_index": number}, part, piece_chars)
    elif kind == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        arguments = item.get("arguments", "")
        payloads += [
            {"type": "response.function_call_arguments.delta", **at, "delta": piece}
            for piece in pieces(arguments, piece_chars)
        ]
        payloads.append({"type": "response.function_call_arguments.done", **at, "arguments": arguments})
    elif kind == "reasoning":
        added = {**item, "summary": []}
        for number, part in enumerate(item.get("summary") or []):
            payloads += _summary_payloads(at | {"summary_index": number}, part, piece_chars)
    else:
        added = item
    return [
        {"type": "response.output_item.added", "output_index": index, "item": added},
        *payloads,
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _part_payloads(at: dict[str, Any], part: dict[str, Any], piece_chars: int) -> list[dict[str, Any]]:
    if part.get("type") != "output_text":
        return [
            {"type": "response.content_part.added", **at, "part": part},
            {"type": "response.content_part.done", **at, "part": part},
        ]
    text = part.get("text", "")
    return [
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *[
            {"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
            for piece in pieces(text, piece_chars)
        ],
        {"type": "response.output_text.done", **at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
    ]


def _summary_payloads(at: dict[str, Any], part: dict[str, Any], piece_chars: int) -> list[dict[str, Any]]:
    text = part.get("text", "")
    return [
        {"type": "response.reasoning_summary_part.added", **at, "part": {**part, "text": ""}},
        *[
            {"type": "response.reasoning_summary_text.delta", **at, "delta": piece}
            for piece in pieces(text, piece_chars)
        ],
        {"type": "response.reasoning_summary_text.done", **at, "text": text},
        {"type": "response.reasoning_summary_part.done", **at, "part": part},
    ]


def _normal_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        return normal.message("user", [normal.clean(item)])
    kind = item.get("type", "message")
    if kind == "function_call":
        return normal.message("assistant", [normal.tool_call(item.get("name"), item.get("arguments"))])
    if kind == "function_call_output":
        output = item.get("output")
        content = _normal_content(output) if isinstance(output, list) else [normal.text_block(output)]
        return normal.message("tool", [{"type": "tool_result", "content": content}])
    if kind == "reasoning":
        summary = "".join(str(part.get("text", "")) for part in item.get("summary") or [])
        return normal.message("assistant", [{"type": "thinking", "text": normal.clean(summary)}])
    if kind == "message":
        return normal.message(item.get("role"), _normal_content(item.get("content")))
    return normal.message("item", [normal.clean(item)])


def _normal_content(content: Any) -> list[Any]:
    if content is None:
        return []
    if not isinstance(content, list):
        return [normal.text_block(content)]
    blocks: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS:
            blocks.append(normal.text_block(part.get("text", "")))
        elif kind == "input_image":
            blocks.append(
                {"type": "image", "source": normal.clean(part.get("image_url") or part.get("file_id"))}
            )
        else:
            blocks.append(normal.clean(part))
    return blocks


def _normal_tool(definition: Any) -> Any:
    if not isinstance(definition, dict) or definition.get("type") != "function":
        return normal.clean(definition)
    return normal.tool(definition.get("name"), definition.get("description"), definition.get("parameters"))
