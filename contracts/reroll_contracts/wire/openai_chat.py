"""OpenAI Chat Completions: ``POST /v1/chat/completions``, streamed as ``chat.completion.chunk``
events (no ``event:`` field) ending in ``data: [DONE]``.

- `assemble_chat_completion` folds the chunks into the ``chat.completion`` object a
  non-streamed request would have returned;
- `completion_to_events` goes the other way, the way OpenAI streams (text in pieces, tool-call
  name first, then its arguments in pieces);
- `OpenAIChat.normalise_response`: the first choice's ``message`` (``reasoning_content`` or
  ``reasoning`` a ``thinking`` block, then the content, then the ``tool_calls``); usage
  ``prompt_tokens`` / ``completion_tokens`` / ``prompt_tokens_details.cached_tokens``;
- `OpenAIChat.normalise`: ``messages`` (``tool_calls`` become ``tool_call`` blocks, a ``tool``
  message one ``tool_result`` block), ``tools`` (``function`` definitions), the rest params.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import orjson

from reroll_contracts.trajectory import DONE, SseEvent
from reroll_contracts.wire import normal
from reroll_contracts.wire.normal import NormalRequest, NormalResponse
from reroll_contracts.wire.sse import json_payloads, pieces


class OpenAIAuthAndErrors:
    """What OpenAI's APIs share: bearer auth upstream and one error body shape."""

    def upstream_headers(self, api_key: str | None, agent_headers: Mapping[str, str]) -> dict[str, str]:
        """``Authorization: Bearer KEY`` (nothing without a key)."""
        return bearer_headers(api_key)

    def error_body(self, kind: str, message: str) -> bytes:
        """``{"error": {"message", "type": kind, "param": null, "code": kind}}``."""
        return openai_error_body(kind, message)


class OpenAIChat(OpenAIAuthAndErrors):
    """The Chat Completions `reroll_contracts.wire.WireFormat`."""

    name: Final = "openai-chat"
    paths = ("/v1/chat/completions", "/chat/completions")
    upstream_path = "/chat/completions"
    conversation_key = "messages"
    terminal_markers = (DONE.encode(),)

    def is_terminal(self, event: SseEvent) -> bool:
        """``data: [DONE]``."""
        return event.is_done

    def assemble(self, events: Iterable[SseEvent]) -> dict[str, Any]:
        """See `assemble_chat_completion`."""
        return assemble_chat_completion(events)

    def to_events(
        self, body: dict[str, Any], request: dict[str, Any], piece_chars: int = 16
    ) -> list[SseEvent]:
        """See `completion_to_events`; the usage chunk when ``stream_options.include_usage``."""
        options = request.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return completion_to_events(body, piece_chars=piece_chars, include_usage=include_usage)

    def normalise(self, body: dict[str, Any]) -> NormalRequest:
        """See the module docstring."""
        messages = body.get("messages")
        tools = body.get("tools")
        return {
            "messages": [_normal_message(m) for m in messages] if isinstance(messages, list) else [],
            "tools": [_normal_tool(t) for t in tools] if isinstance(tools, list) else [],
            "params": normal.params_of(body, ("messages", "tools")),
        }

    def normalise_response(self, body: dict[str, Any]) -> NormalResponse:
        """See the module docstring."""
        choices = body.get("choices") or [{}]
        choice = choices[0] if isinstance(choices[0], dict) else {}
        answer = choice.get("message") or {}
        blocks: list[dict[str, Any]] = []
        reasoning = answer.get("reasoning_content") or answer.get("reasoning")
        if isinstance(reasoning, str):
            blocks.append({"type": "thinking", "text": reasoning})
        blocks += _verbatim_content(answer.get("content"))
        for call in answer.get("tool_calls") or []:
            function = call.get("function") or {}
            blocks.append(
                normal.response_tool_call(call.get("id"), function.get("name"), function.get("arguments"))
            )
        return {
            "message": normal.assistant(blocks),
            "usage": normal.openai_usage(
                body.get("usage"), "prompt_tokens", "completion_tokens", "prompt_tokens_details"
            ),
            "stop_reason": choice.get("finish_reason"),
        }


FORMAT = OpenAIChat()


def _verbatim_content(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if not isinstance(content, list):
        return [normal.text_block(content)]
    return [
        normal.text_block(part.get("text", "")) if part.get("type") == "text" else part
        for part in content
        if isinstance(part, dict)
    ]


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """``{"Authorization": "Bearer KEY"}``, or nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def openai_error_body(kind: str, message: str) -> bytes:
    """An OpenAI error body: ``{"error": {"message", "type": kind, "param": null, "code": kind}}``."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": kind}})


def _normal_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return normal.message("user", [normal.clean(message)])
    role = message.get("role")
    blocks = _normal_content(message.get("content"))
    if role in ("tool", "function"):
        return normal.message("tool", [{"type": "tool_result", "content": blocks}])
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        blocks.append(normal.tool_call(function.get("name"), function.get("arguments")))
    return normal.message(role, blocks)


def _normal_content(content: Any) -> list[Any]:
    if content is None:
        return []
    if not isinstance(content, list):
        return [normal.text_block(content)]
    blocks: list[Any] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            blocks.append(normal.text_block(part.get("text", "")))
        elif kind == "image_url":
            image = part.get("image_url")
            source = image.get("url") if isinstance(image, dict) else image
            blocks.append({"type": "image", "source": normal.clean(source)})
        else:
            blocks.append(normal.clean(part))
    return blocks


def _normal_tool(definition: Any) -> Any:
    function = definition.get("function") if isinstance(definition, dict) else None
    if not isinstance(function, dict):
        return normal.clean(definition)
    return normal.tool(function.get("name"), function.get("description"), function.get("parameters"))


def assemble_chat_completion(events: Iterable[SseEvent]) -> dict[str, Any]:
    """Fold ``chat.completion.chunk`` events into one ``chat.completion`` object.

    String fields of each choice's ``delta`` (``content``, ``refusal``, ``reasoning_content``...)
    are concatenated; ``tool_calls`` are merged by their ``index`` (id, type and function name
    from the first delta that has them, ``arguments`` concatenated). Events whose data is not a
    JSON object (``[DONE]``, keep-alives) are skipped.

    Args:
        events: the stream's events, in order.

    Returns:
        ``{"id", "object": "chat.completion", "created", "model", "choices": [...], "usage"?,
        "system_fingerprint"?}``; choices are sorted by index, each with ``message`` and
        ``finish_reason``.
    """
    completion: dict[str, Any] = {"id": None, "object": "chat.completion", "created": None, "model": None}
    choices: dict[int, dict[str, Any]] = {}
    missing = ["id", "created", "model", "system_fingerprint"]  # taken from the first chunk that has them
    for chunk in json_payloads(events):
        if missing:
            for key in [key for key in missing if chunk.get(key) is not None]:
                completion[key] = chunk[key]
                missing.remove(key)
        if (usage := chunk.get("usage")) is not None:
            completion["usage"] = usage
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            slot = choices.get(index)
            if slot is None:
                slot = choices[index] = {"index": index, "message": {"role": "assistant"}, "tool_calls": {}}
            if delta := choice.get("delta"):
                _merge_delta(slot, delta)
            if (finish_reason := choice.get("finish_reason")) is not None:
                slot["finish_reason"] = finish_reason
    completion["choices"] = [_finish_choice(choices[index]) for index in sorted(choices)]
    return completion


def _merge_delta(slot: dict[str, Any], delta: dict[str, Any]) -> None:
    message = slot["message"]
    for key, value in delta.items():
        if key == "tool_calls":
            for call_delta in value or []:
                _merge_tool_call(slot["tool_calls"], call_delta)
        elif key == "role" and value:
            message["role"] = value
        elif isinstance(value, str):
            message[key] = message.get(key, "") + value
        elif value is not None and key not in message:
            message[key] = value


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    fresh = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    call = calls.setdefault(delta.get("index", len(calls)), fresh)
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["function"]["name"] += function["name"]
    if function.get("arguments"):
        call["function"]["arguments"] += function["arguments"]


def _finish_choice(slot: dict[str, Any]) -> dict[str, Any]:
    message = slot["message"]
    message.setdefault("content", None)
    if slot["tool_calls"]:
        message["tool_calls"] = [slot["tool_calls"][index] for index in sorted(slot["tool_calls"])]
    return {"index": slot["index"], "message": message, "finish_reason": slot.get("finish_reason")}


def completion_to_events(
    completion: dict[str, Any], *, piece_chars: int = 16, include_usage: bool = False
) -> list[SseEvent]:
    """Split a ``chat.completion`` object into the chunk events that would have streamed it.

    Args:
        completion: a ``chat.completion`` object (e.g. a recorded non-streamed response).
        piece_chars: characters of text or tool-call arguments per chunk (>= 1).
        include_usage: add the final usage chunk (empty ``choices``), as OpenAI does when the
            request sets ``stream_options.include_usage``; only if `completion` has ``usage``.

    Returns:
        The events, ending with ``data: [DONE]``; `assemble_chat_completion` folds them back.
    """
    head: dict[str, Any] = {key: completion[key] for key in ("id", "created", "model") if key in completion}
    head["object"] = "chat.completion.chunk"
    if completion.get("system_fingerprint") is not None:
        head["system_fingerprint"] = completion["system_fingerprint"]
    chunks: list[dict[str, Any]] = []
    for choice in completion.get("choices") or []:
        index = choice.get("index", 0)
        deltas = _choice_deltas(choice.get("message") or {}, max(1, piece_chars))
        chunks += [{"index": index, "delta": delta, "finish_reason": None} for delta in deltas]
        chunks.append({"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")})
    events = [_chunk_event({**head, "choices": [choice]}) for choice in chunks]
    if include_usage and completion.get("usage") is not None:
        events.append(_chunk_event({**head, "choices": [], "usage": completion["usage"]}))
    return [*events, SseEvent(data=DONE)]


def _choice_deltas(message: dict[str, Any], piece_chars: int) -> list[dict[str, Any]]:
    content = message.get("content")
    deltas: list[dict[str, Any]] = [
        {"role": message.get("role", "assistant"), "content": "" if isinstance(content, str) else None}
    ]
    for key, value in message.items():
        if key not in ("role", "tool_calls") and isinstance(value, str):
            deltas += [{key: piece} for piece in pieces(value, piece_chars)]
    for position, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": position,
                        "id": call.get("id"),
                        "type": call.get("type", "function"),
                        "function": {"name": function.get("name", ""), "arguments": ""},
                    }
                ]
            }
        )
        deltas += [
            {"tool_calls": [{"index": position, "function": {"arguments": piece}}]}
            for piece in pieces(function.get("arguments") or "", piece_chars)
        ]
    return deltas


def _chunk_event(chunk: dict[str, Any]) -> SseEvent:
    return SseEvent(data=orjson.dumps(chunk).decode())
