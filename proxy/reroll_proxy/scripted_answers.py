"""The scripted model's answers in each API format (pure): which turn a request is at, and the
response body answering it.

The turn is the number of assistant turns already in the request:

- Chat Completions and Anthropic Messages: the ``assistant`` messages;
- Responses: the runs of assistant items in ``input`` (``message`` items with role
  ``assistant``, ``function_call`` and ``reasoning`` items; a run of them is one turn), plus,
  with ``previous_response_id``, the turn after the one that response answered (its id is
  ``resp_scripted_<turn>``).

Ids are deterministic per turn k: ``chatcmpl-scripted-k`` / ``resp_scripted_k`` /
``msg_scripted_k``, tool calls ``call_k_j`` (Anthropic: ``toolu_k_j``); in a named thread T of the
script, ``T-k`` stands for k (``resp_scripted_T-k``, ``toolu_T-k_j``), so two threads never
hand out the same id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from reroll_contracts.errors import RequestShapeError

CREATED_BASE = 1_700_000_000
"""``created`` of turn k is CREATED_BASE + k (seconds since the epoch)."""
DEFAULT_MODEL = "scripted"
_RESPONSE_ID = re.compile(r"resp_scripted_(?:[a-z][a-z0-9_]*-)?(\d+)")


class ToolCall(NamedTuple):
    """One function tool call of an answer."""

    name: str
    arguments: str
    """Its arguments, JSON."""
    namespace: str | None = None
    """The tool group it belongs to (the Responses API's ``namespace`` tools: Codex offers each MCP
    server's tools as one, ``mcp__<server>``): a Responses call carries it beside `name`; the other
    formats have no groups and name the tool ``<namespace>__<name>``."""

    @property
    def flat_name(self) -> str:
        """`name`, prefixed ``<namespace>__`` when it has a namespace."""
        return f"{self.namespace}__{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class Answer:
    """What the model says at one turn, format-neutral."""

    index: int
    """The turn, from 0."""
    content: str | None
    """The text (None: none)."""
    tool_calls: list[ToolCall]
    """Its function tool calls, in order."""
    thinking: str | None
    """Reasoning text (Anthropic thinking block, Responses reasoning summary, Chat ``reasoning_content``)."""
    thread: str = ""
    """The script thread that answers ("": the default one); part of every id."""

    @property
    def key(self) -> str:
        """What the ids carry for this turn: ``k``, or ``T-k`` in thread T."""
        return f"{self.thread}-{self.index}" if self.thread else str(self.index)


def turn_index(api_format: str, body: dict[str, Any]) -> int:
    """The turn `body` asks for (see the module docstring).

    Raises:
        RequestShapeError: Chat / Messages without a ``messages`` list, Responses without ``input``.
    """
    if api_format == "openai-responses":
        return _responses_turn(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("request body needs a 'messages' list")
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def answer_body(api_format: str, answer: Answer, request: dict[str, Any]) -> dict[str, Any]:
    """The non-streamed response body of `answer` in `api_format`, answering `request`."""
    model = request.get("model")
    model = model if isinstance(model, str) and model else DEFAULT_MODEL
    prompt_tokens = count_prompt_tokens(request)
    written = (answer.content or "") + "".join(call.arguments for call in answer.tool_calls)
    completion_tokens = max(1, len(written) // 4)
    if api_format == "openai-responses":
        return _response(answer, model, prompt_tokens, completion_tokens)
    if api_format == "anthropic-messages":
        return _message(answer, model, prompt_tokens, completion_tokens)
    return _completion(answer, model, prompt_tokens, completion_tokens)


def count_prompt_tokens(request: dict[str, Any]) -> int:
    """The scripted model's token count of `request`'s prompt (its system prompt, instructions,
    messages and input): one per four bytes of their JSON. The ``usage`` of its answers and its
    ``count_tokens`` endpoint both say this number."""
    prompt = [request.get(key) for key in ("system", "instructions", "messages", "input")]
    return len(orjson.dumps(prompt)) // 4


def _responses_turn(body: dict[str, Any]) -> int:
    given = body.get("input")
    if not isinstance(given, str | list):
        raise RequestShapeError("request body needs an 'input' string or list")
    turns = 0
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and (match := _RESPONSE_ID.fullmatch(previous)):
        turns = int(match.group(1)) + 1
    in_turn = False
    for item in given if isinstance(given, list) else []:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        by_model = kind in ("function_call", "reasoning") or (
            kind == "message" and isinstance(item, dict) and item.get("role") == "assistant"
        )
        turns += by_model and not in_turn
        in_turn = by_model
    return turns


def _completion(answer: Answer, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    k, created = answer.key, CREATED_BASE + answer.index
    calls = [
        {
            "id": f"call_{k}_{j}",
            "type": "function",
            "function": {"name": call.flat_name, "arguments": call.arguments},
        }
        for j, call in enumerate(answer.tool_calls)
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.content if answer.content or calls else "",
    }
    if answer.thinking is not None:
        message["reasoning_content"] = answer.thinking
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-scripted-{k}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _response(answer: Answer, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    k, created = answer.key, CREATED_BASE + answer.index
    output: list[dict[str, Any]] = []
    if answer.thinking is not None:
        summary = [{"type": "summary_text", "text": answer.thinking}]
        output.append({"id": f"rs_scripted_{k}", "type": "reasoning", "summary": summary})
    if answer.content is not None or not answer.tool_calls:
        text = {"type": "output_text", "text": answer.content or "", "annotations": [], "logprobs": []}
        output.append(
            {
                "id": f"msg_scripted_{k}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            }
        )
    output += [
        {
            "id": f"fc_scripted_{k}_{j}",
            "type": "function_call",
            "call_id": f"call_{k}_{j}",
            **({"namespace": call.namespace} if call.namespace else {}),
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        for j, call in enumerate(answer.tool_calls)
    ]
    return {
        "id": f"resp_scripted_{k}",
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _message(answer: Answer, model: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    k = answer.key
    content: list[dict[str, Any]] = []
    if answer.thinking is not None:
        content.append({"type": "thinking", "thinking": answer.thinking, "signature": f"sig-scripted-{k}"})
    if answer.content is not None or not answer.tool_calls:
        content.append({"type": "text", "text": answer.content or ""})
    content += [
        {"type": "tool_use", "id": f"toolu_{k}_{j}", "name": call.flat_name, "input": _input(call.arguments)}
        for j, call in enumerate(answer.tool_calls)
    ]
    return {
        "id": f"msg_scripted_{k}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if answer.tool_calls else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens},
    }


def _input(arguments: str) -> Any:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
