"""OpenAI Responses ↔ Chat Completions, field by field (pure), both directions.

**A Responses agent, a Chat upstream.** Requests (`responses_to_chat`): ``instructions`` becomes
the system message; ``input`` (a string: one user message) item by item: ``message`` items keep
their role with ``input_text`` / ``output_text`` parts as text and ``input_image`` parts as
``image_url``; a run of ``function_call`` items joins the assistant message before it (or opens
one) as its ``tool_calls`` (``call_id`` as the id); ``function_call_output`` becomes a ``tool``
message; ``reasoning`` items are dropped (Chat has no field for them). Flat ``function`` tools
become Chat's nested ones, ``tool_choice`` likewise; ``max_output_tokens`` → ``max_tokens``;
``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``, ``stream`` (with usage) as they
are. A ``previous_response_id`` cannot be translated (the history lives with the provider), nor
can built-in tools (web search, file search...).

Responses (`completion_to_response`): ``reasoning_content`` → a ``reasoning`` item (summary
text), ``content`` → a ``message`` item (``output_text``), each tool call → a ``function_call``
item; ``finish_reason: length`` → status ``incomplete`` (``max_output_tokens``), otherwise
``completed``; usage ``prompt_tokens`` / ``completion_tokens`` → ``input_tokens`` /
``output_tokens``.

**A Chat agent, a Responses upstream** (the reverse). Requests (`chat_to_responses`): leading
``system`` / ``developer`` messages join into ``instructions``; later ones, and ``user``
messages, become ``message`` items (``text`` parts → ``input_text``, ``image_url`` →
``input_image``); an assistant message becomes a ``message`` item (its text) then one
``function_call`` item per tool call (its id as ``call_id``); a ``tool`` message becomes a
``function_call_output``. Nested ``function`` tools become flat ones, ``tool_choice`` likewise;
``max_tokens`` / ``max_completion_tokens`` → ``max_output_tokens``; ``reasoning_effort`` →
``reasoning.effort``; ``response_format`` → ``text.format``; ``temperature``, ``top_p``,
``parallel_tool_calls``, ``user``, ``stream`` as they are (``stream_options`` is dropped: a
Responses stream always ends with its usage); ``store`` keeps Chat's default, false (Responses'
is true). Refused, as Responses has no counterpart: ``n`` > 1,
``logprobs`` / ``top_logprobs``, ``stop``, ``seed``, ``logit_bias``, ``presence_penalty`` /
``frequency_penalty`` (unless 0), audio (``audio``, ``modalities`` with audio, ``input_audio``
parts), ``prediction``, the legacy ``functions`` / ``function_call`` and ``function`` role, and
non-function tools.

Responses (`response_to_completion`): ``message`` items' ``output_text`` → ``content`` (a
``refusal`` part → ``refusal``), ``reasoning`` items' summary (or content) text →
``reasoning_content``, ``function_call`` items → ``tool_calls``; other items (built-in tool
calls, which the request never asks for) are dropped. ``finish_reason``: ``tool_calls`` when
there are calls, else ``length`` for an ``incomplete`` response cut at ``max_output_tokens``,
``content_filter`` for one cut by the filter, otherwise ``stop``. Usage ``input_tokens`` /
``output_tokens`` → ``prompt_tokens`` / ``completion_tokens`` (with cached and reasoning tokens).
"""

from __future__ import annotations

from typing import Any

from reroll_contracts.errors import UntranslatableError

Body = dict[str, Any]
_TEXT_PARTS = ("input_text", "output_text", "text")


def responses_to_chat(body: Body) -> Body:
    """The Responses request `body` as a Chat Completions request (see the module docstring).

    Raises:
        UntranslatableError: ``previous_response_id``, a built-in tool, or an item or part with
            no Chat counterpart.
    """
    if body.get("previous_response_id"):
        raise UntranslatableError("previous_response_id refers to history only the provider holds")
    messages: list[Body] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given or []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(
                {"role": item.get("role"), "content": _chat_content(item.get("role"), item.get("content"))}
            )
        elif kind == "function_call":
            call = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
            tool_call = {"id": item.get("call_id"), "type": "function", "function": call}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(tool_call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":
            raise UntranslatableError(f"a Responses input item of type {kind!r} has no Chat counterpart")
    request: Body = {"model": body.get("model"), "messages": messages}
    if body.get("max_output_tokens") is not None:
        request["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p", "parallel_tool_calls", "user", "stream"):
        if body.get(key) is not None:
            request[key] = body[key]
    if body.get("stream") is True:
        request["stream_options"] = {"include_usage": True}
    if body.get("tools"):
        request["tools"] = [_chat_tool(tool) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        request["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        request["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return request


_CHAT_PARAMS = frozenset(
    {"model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p"}
    | {"parallel_tool_calls", "user", "stream"}
)
"""The Responses request fields `responses_to_chat` maps."""


def shed_for_chat(body: Body) -> tuple[Body, list[str]]:
    """`body` without what Chat cannot hold but a model can do without, and a note per part shed.

    What a Responses agent such as Codex CLI sends besides its conversation: built-in tools
    (``web_search``...) and ``namespace`` tool groups (its subagent tools) are dropped, as are
    ``reasoning`` input items (their ``encrypted_content`` is readable by the provider that wrote
    it only), and the fields `responses_to_chat` does not map (``reasoning``, ``include``,
    ``client_metadata``, ``prompt_cache_key``, ``store``, ``text``...) are named. What cannot be
    shed (``previous_response_id``, another item or part) is left for `responses_to_chat` to refuse.

    Args:
        body: a Responses request body (not changed).

    Returns:
        (the body to translate, one line per part dropped), the notes in a stable order.
    """
    notes: list[str] = []
    kept = dict(body)
    tools = body.get("tools")
    if isinstance(tools, list):
        shed = [tool for tool in tools if isinstance(tool, dict) and tool.get("type") != "function"]
        kept["tools"] = [tool for tool in tools if tool not in shed]
        notes += [f"dropped tool {_tool_label(tool)}: no Chat counterpart" for tool in shed]
    given = body.get("input")
    if isinstance(given, list):
        reasoning = [item for item in given if isinstance(item, dict) and item.get("type") == "reasoning"]
        if reasoning:
            kept["input"] = [item for item in given if item not in reasoning]
            notes.append(
                f"dropped {len(reasoning)} reasoning item(s) (encrypted_content): no Chat counterpart"
            )
    unmapped = sorted(key for key in body if key not in _CHAT_PARAMS and key != "previous_response_id")
    notes += [f"dropped field {key}: no Chat counterpart" for key in unmapped]
    return kept, notes


def _tool_label(tool: Body) -> str:
    kind = str(tool.get("type"))
    return f"{kind} {tool['name']}" if tool.get("name") else kind


def _text(parts: Any) -> str:
    return "".join(part.get("text", "") for part in parts or [] if part.get("type") in _TEXT_PARTS)


def _chat_content(role: Any, content: Any) -> Any:
    if isinstance(content, str) or role == "assistant":
        return content if isinstance(content, str) else _text(content)
    parts: list[Body] = []
    for part in content or []:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
        else:
            raise UntranslatableError(f"a Responses content part of type {kind!r} has no Chat counterpart")
    return parts


def _chat_tool(tool: Body) -> Body:
    if tool.get("type") != "function":
        raise UntranslatableError(f"the built-in Responses tool {tool.get('type')!r} has no Chat counterpart")
    function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def completion_to_response(completion: Body) -> Body:
    """The Chat ``chat.completion`` as a Responses ``response`` (see the module docstring)."""
    choice = (completion.get("choices") or [{}])[0]
    answer = choice.get("message") or {}
    base = str(completion.get("id") or "chat")
    output: list[Body] = []
    if answer.get("reasoning_content"):
        summary = [{"type": "summary_text", "text": answer["reasoning_content"]}]
        output.append({"id": f"rs_{base}", "type": "reasoning", "summary": summary})
    if answer.get("content") or not answer.get("tool_calls"):
        text: Body = {"type": "output_text", "text": answer.get("content") or "", "annotations": []}
        message = {"id": f"msg_{base}", "type": "message", "role": "assistant", "status": "completed"}
        output.append(message | {"content": [text]})
    for call in answer.get("tool_calls") or []:
        function = call.get("function") or {}
        output.append(
            {
                "id": f"fc_{call.get('id')}",
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
                "status": "completed",
            }
        )
    truncated = choice.get("finish_reason") == "length"
    usage = completion.get("usage") or {}
    prompt, written = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {
        "id": f"resp_{base}",
        "object": "response",
        "created_at": completion.get("created") or 0,
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "error": None,
        "model": completion.get("model"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": written,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + written,
        },
    }


_NO_COUNTERPART = (
    "logprobs", "top_logprobs", "stop", "seed", "logit_bias", "presence_penalty", "frequency_penalty",
    "audio", "prediction", "functions", "function_call",
)  # fmt: skip
"""Chat request keys refused when set to anything but a neutral value (None, False, 0, empty)."""


def chat_to_responses(body: Body) -> Body:
    """The Chat Completions request `body` as a Responses request (see the module docstring).

    Raises:
        UntranslatableError: a parameter, message role, content part or tool with no Responses
            counterpart (the message names it).
    """
    for key in _NO_COUNTERPART:
        if body.get(key) not in (None, False, 0, "", [], {}):
            raise UntranslatableError(f"the Chat parameter {key!r} has no Responses counterpart")
    if body.get("n") not in (None, 1):
        raise UntranslatableError(
            f"the Chat parameter 'n' = {body['n']!r} (several choices) has no Responses counterpart"
        )
    if "audio" in (body.get("modalities") or []):
        raise UntranslatableError("audio output ('modalities') has no Responses counterpart")
    messages = list(body.get("messages") or [])
    instructions: list[str] = []
    while messages and messages[0].get("role") in ("system", "developer"):
        instructions.append(_chat_text(messages.pop(0).get("content")))
    request: Body = {"model": body.get("model"), "input": [item for m in messages for item in _items(m)]}
    # Chat's `store` defaults to false, Responses' to true: keep Chat's, so the provider keeps
    # nothing the agent did not ask it to (the agent resends the whole history anyway).
    request["store"] = bool(body.get("store", False))
    if instructions:
        request["instructions"] = "\n\n".join(instructions)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        request["max_output_tokens"] = limit
    for key in ("temperature", "top_p", "parallel_tool_calls", "user", "stream"):
        if body.get(key) is not None:
            request[key] = body[key]
    if body.get("reasoning_effort"):
        request["reasoning"] = {"effort": body["reasoning_effort"]}
    if body.get("response_format"):
        request["text"] = {"format": _text_format(body["response_format"])}
    if body.get("tools"):
        request["tools"] = [_responses_tool(tool) for tool in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        request["tool_choice"] = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        request["tool_choice"] = {"type": "function", "name": (choice.get("function") or {}).get("name")}
    return request


def _chat_text(content: Any) -> str:
    if isinstance(content, str) or content is None:
        return content or ""
    return "".join(part.get("text") or part.get("refusal") or "" for part in content)


def _items(message: Body) -> list[Body]:
    role = message.get("role")
    if role in ("system", "developer", "user"):
        return [{"type": "message", "role": role, "content": _responses_content(message.get("content"))}]
    if role == "tool":
        output = _chat_text(message.get("content"))
        return [{"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": output}]
    if role != "assistant":
        raise UntranslatableError(f"message role {role!r} has no Responses counterpart")
    items: list[Body] = []
    if text := _chat_text(message.get("content")):
        items.append({"type": "message", "role": "assistant", "content": text})
    for call in message.get("tool_calls") or []:
        if call.get("type", "function") != "function":
            raise UntranslatableError(
                f"a Chat tool call of type {call.get('type')!r} has no Responses counterpart"
            )
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": arguments,
            }
        )
    return items


def _responses_content(content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content or ""
    parts: list[Body] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url") or {}
            parts.append(
                {
                    "type": "input_image",
                    "image_url": image.get("url", ""),
                    "detail": image.get("detail", "auto"),
                }
            )
        else:
            raise UntranslatableError(f"a Chat content part of type {kind!r} has no Responses counterpart")
    return parts


def _responses_tool(tool: Body) -> Body:
    if tool.get("type") != "function":
        raise UntranslatableError(f"a Chat tool of type {tool.get('type')!r} has no Responses counterpart")
    function = tool.get("function") or {}
    flat: Body = {"type": "function", "name": function.get("name")}
    flat["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    for key in ("description", "strict"):
        if function.get(key) is not None:
            flat[key] = function[key]
    return flat


def _text_format(response_format: Body) -> Body:
    if response_format.get("type") != "json_schema":
        return {"type": response_format.get("type")}
    return {"type": "json_schema", **(response_format.get("json_schema") or {})}


_FINISH_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}
"""Responses ``incomplete_details.reason`` → Chat ``finish_reason``."""


def response_to_completion(response: Body) -> Body:
    """The Responses ``response`` as a Chat ``chat.completion`` (see the module docstring)."""
    text: list[str] = []
    refusal: list[str] = []
    reasoning: list[str] = []
    calls: list[Body] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "refusal":
                    refusal.append(part.get("refusal", ""))
                else:
                    text.append(part.get("text", ""))
        elif kind == "reasoning":
            parts = item.get("summary") or item.get("content") or []
            reasoning += [part.get("text", "") for part in parts]
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments") or ""}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
    message: Body = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if refusal:
        message["refusal"] = "".join(refusal)
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    cut = (response.get("incomplete_details") or {}).get("reason")
    finish = "tool_calls" if calls else _FINISH_REASONS.get(cut or "", "stop")
    usage = response.get("usage") or {}
    prompt, written = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
    thought = (usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "id": str(response.get("id") or "resp"),
        "object": "chat.completion",
        "created": response.get("created_at") or 0,
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": written,
            "total_tokens": prompt + written,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": thought},
        },
    }
