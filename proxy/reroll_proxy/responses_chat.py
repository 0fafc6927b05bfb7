"""OpenAI Responses → Chat Completions, field by field (pure): a Responses agent, a Chat upstream.

Requests (`responses_to_chat`): ``instructions`` becomes the system message; ``input`` (a
string: one user message) item by item: ``message`` items keep their role with ``input_text`` /
``output_text`` parts as text and ``input_image`` parts as ``image_url``; a run of
``function_call`` items joins the assistant message before it (or opens one) as its
``tool_calls`` (``call_id`` as the id); ``function_call_output`` becomes a ``tool`` message;
``reasoning`` items are dropped (Chat has no field for them). Flat ``function`` tools become
Chat's nested ones, ``tool_choice`` likewise; ``max_output_tokens`` → ``max_tokens``;
``temperature``, ``top_p``, ``parallel_tool_calls``, ``user``, ``stream`` (with usage) as they
are. A ``previous_response_id`` cannot be translated (the history lives with the provider), nor
can built-in tools (web search, file search...).

Responses (`completion_to_response`): ``reasoning_content`` → a ``reasoning`` item (summary
text), ``content`` → a ``message`` item (``output_text``), each tool call → a ``function_call``
item; ``finish_reason: length`` → status ``incomplete`` (``max_output_tokens``), otherwise
``completed``; usage ``prompt_tokens`` / ``completion_tokens`` → ``input_tokens`` /
``output_tokens``.
"""

from __future__ import annotations

from typing import Any

from reroll_proxy.chat_anthropic import UntranslatableError

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
