"""OpenAI Chat Completions ↔ Anthropic Messages, field by field (pure: bodies in, bodies out).

Requests, Chat → Messages (`chat_to_messages`; `messages_to_chat` is the inverse):

=====================================  ================================================
Chat Completions                       Anthropic Messages
=====================================  ================================================
``system`` / ``developer`` messages    ``system`` (text blocks)
``content`` string or ``text`` parts   ``text`` blocks (empty texts dropped)
``image_url`` parts (URL or data URL)  ``image`` blocks (``url`` or ``base64`` source)
assistant ``tool_calls``               ``tool_use`` blocks (arguments parsed as ``input``)
``tool`` messages                      ``tool_result`` blocks in a ``user`` message
``tools`` (``function``)               ``tools`` (``input_schema`` = ``parameters``)
``tool_choice`` auto/required/none/fn  ``tool_choice`` auto/any/none/tool
``parallel_tool_calls: false``         ``tool_choice.disable_parallel_tool_use``
``max_completion_tokens``/max_tokens   ``max_tokens`` (`DEFAULT_MAX_TOKENS` when absent)
``stop`` (string or list)              ``stop_sequences``
``temperature``, ``top_p``, ``stream``  the same
``user``                               ``metadata.user_id``
=====================================  ================================================

Consecutive messages of one role are merged (Anthropic alternates user / assistant). Other
Chat parameters (``n``, ``seed``, ``logprobs``, ``response_format``, penalties...) have no
Messages counterpart and are dropped; ``thinking`` blocks sent back by an Anthropic agent are
dropped towards Chat (Chat has no field for them), as are the Messages fields Chat lacks
(``thinking``, ``context_management``, ``output_config``...) and the ``anthropic-beta`` betas:
`messages_dropped` lists them, and the proxy notes them in the exchange's metadata
(``translation_notes``).

Responses, Messages → Chat (`message_to_completion`; `completion_to_message` is the inverse):
text blocks become ``content``, ``tool_use`` blocks ``tool_calls`` (input JSON-encoded as
``arguments``), ``thinking`` blocks ``reasoning_content``; stop reasons map ``end_turn`` and
``stop_sequence`` → ``stop``, ``max_tokens`` → ``length``, ``tool_use`` → ``tool_calls``,
``refusal`` → ``content_filter``; usage ``input_tokens`` (+ cache reads and writes) →
``prompt_tokens``, ``output_tokens`` → ``completion_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from reroll_contracts.errors import UntranslatableError

Body = dict[str, Any]
DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` sent to an Anthropic upstream when the Chat request sets no limit (Anthropic
requires one)."""
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_CHOICE_TO_ANTHROPIC = {"auto": "auto", "required": "any", "none": "none"}
_CHOICE_TO_CHAT = {"auto": "auto", "any": "required", "none": "none"}


# Chat → Messages -----------------------------------------------------------------------------


def chat_to_messages(body: Body) -> Body:
    """The Chat Completions request `body` as an Anthropic Messages request (see the module docstring).

    Raises:
        UntranslatableError: a message role or content part with no Messages counterpart.
    """
    system: list[Body] = []
    messages: list[Body] = []
    for entry in body.get("messages") or []:
        role = entry.get("role")
        if role in ("system", "developer"):
            system += _anthropic_blocks(entry.get("content"))
            continue
        if role == "tool":
            role, blocks = "user", [_tool_result(entry)]
        elif role == "assistant":
            blocks = _anthropic_blocks(entry.get("content")) + [
                _tool_use(call) for call in entry.get("tool_calls") or []
            ]
        elif role == "user":
            blocks = _anthropic_blocks(entry.get("content"))
        else:
            raise UntranslatableError(f"message role {role!r} has no Anthropic Messages counterpart")
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += blocks
        else:
            messages.append({"role": role, "content": blocks})
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
    request: Body = {"model": body.get("model"), "max_tokens": limit, "messages": messages}
    if system:
        request["system"] = system
    for key in ("temperature", "top_p", "stream"):
        if body.get(key) is not None:
            request[key] = body[key]
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if isinstance(body.get("user"), str):
        request["metadata"] = {"user_id": body["user"]}
    if body.get("tools"):
        request["tools"] = [_anthropic_tool(tool) for tool in body["tools"]]
    choice = _anthropic_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None:
        request["tool_choice"] = choice
    return request


def _anthropic_blocks(content: Any) -> list[Body]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[Body] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            blocks.append(_anthropic_image(image.get("url", "") if isinstance(image, dict) else str(image)))
        else:
            raise UntranslatableError(f"a Chat content part of type {kind!r} has no Anthropic counterpart")
    return blocks


def _anthropic_image(url: str) -> Body:
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url.removeprefix("data:").partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _tool_result(entry: Body) -> Body:
    content = entry.get("content")
    result = content if isinstance(content, str) else _anthropic_blocks(content)
    return {"type": "tool_result", "tool_use_id": entry.get("tool_call_id"), "content": result}


def _tool_use(call: Body) -> Body:
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError as exc:
        raise UntranslatableError(f"tool call {call.get('id')!r}: arguments are not JSON ({exc})") from exc
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": parsed}


def _anthropic_tool(tool: Body) -> Body:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict):
        raise UntranslatableError(f"a Chat tool of type {tool.get('type')!r} has no Anthropic counterpart")
    schema = function.get("parameters") or {"type": "object", "properties": {}}
    described = {"description": function["description"]} if function.get("description") else {}
    return {"name": function.get("name"), **described, "input_schema": schema}


def _anthropic_tool_choice(choice: Any, parallel: Any) -> Body | None:
    if isinstance(choice, str):
        translated: Body | None = {"type": _CHOICE_TO_ANTHROPIC.get(choice, "auto")}
    elif isinstance(choice, dict):
        translated = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    else:
        translated = None
    if parallel is False:
        translated = (translated or {"type": "auto"}) | {"disable_parallel_tool_use": True}
    return translated


def message_to_completion(message: Body) -> Body:
    """The Anthropic ``message`` response as a Chat ``chat.completion`` (see the module docstring)."""
    blocks = message.get("content") or []
    text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
    thinking = "".join(block.get("thinking", "") for block in blocks if block.get("type") == "thinking")
    calls = [
        {
            "id": block.get("id"),
            "type": "function",
            "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input") or {}).decode(),
            },
        }
        for block in blocks
        if block.get("type") == "tool_use"
    ]
    answer: Body = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        answer["tool_calls"] = calls
    if thinking:
        answer["reasoning_content"] = thinking
    usage = message.get("usage") or {}
    prompt = sum(
        usage.get(key) or 0
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    completion = usage.get("output_tokens") or 0
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": answer,
                "finish_reason": _FINISH.get(message.get("stop_reason") or "", "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


# Messages → Chat -----------------------------------------------------------------------------


def messages_to_chat(body: Body) -> Body:
    """The Anthropic Messages request `body` as a Chat Completions request (see the module docstring).

    Raises:
        UntranslatableError: a content block with no Chat counterpart.
    """
    messages: list[Body] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _chat_text(system)})
    for entry in body.get("messages") or []:
        messages += _chat_messages(entry.get("role"), entry.get("content"))
    request: Body = {"model": body.get("model"), "messages": messages}
    for key in ("max_tokens", "temperature", "top_p", "stream"):
        if body.get(key) is not None:
            request[key] = body[key]
    if body.get("stream") is True:
        request["stream_options"] = {"include_usage": True}
    if body.get("stop_sequences"):
        request["stop"] = list(body["stop_sequences"])
    user = (body.get("metadata") or {}).get("user_id")
    if isinstance(user, str):
        request["user"] = user
    if body.get("tools"):
        request["tools"] = [_chat_tool(tool) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = choice.get("type")
        request["tool_choice"] = (
            {"type": "function", "function": {"name": choice.get("name")}}
            if kind == "tool"
            else _CHOICE_TO_CHAT.get(str(kind), "auto")
        )
        if choice.get("disable_parallel_tool_use"):
            request["parallel_tool_calls"] = False
    return request


_CARRIED_TO_CHAT = frozenset(
    {"model", "messages", "system", "max_tokens", "temperature", "top_p", "stream", "stop_sequences",
     "metadata", "tools", "tool_choice"}
)  # fmt: skip
"""The Messages request fields `messages_to_chat` carries over."""


def messages_dropped(body: Body, headers: Mapping[str, str]) -> list[str]:
    """What `messages_to_chat` leaves out of the Messages request `body` sent with `headers`:
    the fields Chat has no counterpart for (``thinking``, ``context_management``,
    ``output_config``, ``top_k``...), the ``thinking`` blocks sent back, and the betas asked
    for in ``anthropic-beta``; one note per kind, for the exchange's metadata."""
    notes = [f"field {key}" for key in sorted(body) if key not in _CARRIED_TO_CHAT]
    thinking = sum(
        1
        for entry in body.get("messages") or []
        if isinstance(entry, dict) and isinstance(entry.get("content"), list)
        for block in entry["content"]
        if isinstance(block, dict) and block.get("type") in ("thinking", "redacted_thinking")
    )
    if thinking:
        notes.append(f"{thinking} thinking block(s)")
    if betas := headers.get("anthropic-beta"):
        notes.append(f"betas {betas}")
    return notes


def _chat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or [] if block.get("type") == "text")


def _chat_messages(role: Any, content: Any) -> list[Body]:
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[Body] = []
    calls: list[Body] = []
    results: list[Body] = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source") or {})}})
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") or {}).decode()
            call = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": call})
        elif kind == "tool_result":
            text = _chat_text(block.get("content"))
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind not in ("thinking", "redacted_thinking"):
            raise UntranslatableError(f"an Anthropic content block of type {kind!r} has no Chat counterpart")
    if role == "assistant":
        text = "".join(part["text"] for part in parts if part["type"] == "text")
        answer: Body = {"role": "assistant", "content": text or None}
        return [answer | ({"tool_calls": calls} if calls else {})]
    return results + ([{"role": role, "content": parts}] if parts else [])


def _image_url(source: Body) -> str:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    return str(source.get("url", ""))


def _chat_tool(tool: Body) -> Body:
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def completion_to_message(completion: Body) -> Body:
    """The Chat ``chat.completion`` response as an Anthropic ``message`` (see the module docstring)."""
    choices = completion.get("choices") or [{}]
    answer = choices[0].get("message") or {}
    blocks: list[Body] = []
    if answer.get("content"):
        blocks.append({"type": "text", "text": answer["content"]})
    for call in answer.get("tool_calls") or []:
        blocks.append(_tool_use(call))
    usage = completion.get("usage") or {}
    return {
        "id": completion.get("id"),
        "type": "message",
        "role": "assistant",
        "model": completion.get("model"),
        "content": blocks,
        "stop_reason": _STOP.get(choices[0].get("finish_reason") or "", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens", 0),
            "output_tokens": usage.get("completion_tokens", 0),
        },
    }
