"""The common shape every API format's request is normalised to, for divergence checks (pure).

A `NormalRequest` is ``{"messages": [...], "tools": [...], "params": {...}}``:

- ``messages``: one ``{"role", "content": [block, ...]}`` per conversation entry, the system
  prompt first when the format carries it outside the list (``system``, ``instructions``);
  roles are ``system`` (also for ``developer``), ``user``, ``assistant``, ``tool``;
- blocks: ``{"type": "text", "text"}`` (adjacent text blocks joined), ``{"type": "image",
  "source"}``, ``{"type": "tool_call", "name", "arguments"}`` (arguments parsed when they are
  JSON), ``{"type": "tool_result", "content", "is_error"?}``, ``{"type": "thinking", "text"}``,
  or any other block as sent, cleaned;
- ``tools``: ``{"name", "description", "parameters"}`` per function tool, others as sent, cleaned;
- ``params``: every other body field, cleaned, except `IGNORED_PARAMS`.

A `NormalResponse` is the assistant message a response body carries, for exports and viewers:
``{"message": {"role": "assistant", "content": [block, ...]}, "usage", "stop_reason"}`` with the
blocks above, but verbatim (nothing cleaned or stripped: it is what the model said) and each
``tool_call`` block with its ``id`` (the id the next request's tool result answers);
``usage`` in `NormalUsage`'s terms, None when the body has none.

Cleaning (`clean`) drops the keys in `VOLATILE_KEYS` at every depth (ids, timestamps,
``cache_control``, signatures) and strips leading and trailing whitespace from strings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, TypedDict

import orjson

VOLATILE_KEYS = frozenset(
    {"id", "call_id", "tool_call_id", "tool_use_id", "created", "created_at", "cache_control", "signature"}
)
"""Keys that legitimately vary between a recording and its replay; ignored at every depth."""
IGNORED_PARAMS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "metadata",
        "user",
        "store",
        "previous_response_id",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    }
)
"""Body fields that are not model parameters: ``model`` (a continuation swaps it), streaming
(a stream may be replayed to a non-stream request), bookkeeping and ids."""


class NormalRequest(TypedDict):
    """A request in the common shape (see the module docstring)."""

    messages: list[dict[str, Any]]
    tools: list[Any]
    params: dict[str, Any]


class NormalUsage(TypedDict):
    """A response's token counts, the same for every format (None: the body does not say)."""

    prompt_tokens: int | None
    """Every input token, cached or not (Anthropic: input + cache reads + cache writes)."""
    completion_tokens: int | None
    """Tokens generated, reasoning included."""
    cached_tokens: int | None
    """The part of `prompt_tokens` read from the provider's prompt cache."""


class NormalResponse(TypedDict):
    """A response's assistant message in the common shape (see the module docstring)."""

    message: dict[str, Any]
    usage: NormalUsage | None
    stop_reason: str | None
    """The format's own finish / stop reason, as sent."""


def response_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """A verbatim ``tool_call`` block of a response, with its id; JSON string arguments parsed."""
    if isinstance(arguments, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            arguments = orjson.loads(arguments)
    return {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}


def assistant(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message of a `NormalResponse`: `blocks` as given, empty text blocks dropped."""
    kept = [
        block for block in blocks if not (block.get("type") in ("text", "thinking") and not block["text"])
    ]
    return {"role": "assistant", "content": kept}


def openai_usage(usage: Any, prompt: str, completion: str, details: str) -> NormalUsage | None:
    """`NormalUsage` from an OpenAI usage object: its `prompt` and `completion` token counts, and
    ``cached_tokens`` of its `details` object (names differ between Chat and Responses)."""
    if not isinstance(usage, dict):
        return None
    cached = (usage.get(details) or {}).get("cached_tokens")
    return {
        "prompt_tokens": token_count(usage.get(prompt)),
        "completion_tokens": token_count(usage.get(completion)),
        "cached_tokens": token_count(cached),
    }


def token_count(value: Any) -> int | None:
    """`value` when it is a token count (an int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def clean(value: Any) -> Any:
    """`value` without `VOLATILE_KEYS` (at any depth) and with its strings stripped."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {key: clean(item) for key, item in value.items() if key not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [clean(item) for item in value]
    return value


def params_of(body: dict[str, Any], conversation_keys: Iterable[str]) -> dict[str, Any]:
    """The model parameters of `body`: every field but the conversation's and `IGNORED_PARAMS`."""
    skipped = IGNORED_PARAMS | set(conversation_keys)
    return {key: clean(value) for key, value in body.items() if key not in skipped}


def message(role: Any, blocks: list[Any]) -> dict[str, Any]:
    """A normalised message; ``developer`` counts as ``system``, text blocks joined (`join_text`)."""
    role = "system" if role == "developer" else clean(role)
    return {"role": role, "content": join_text(blocks)}


def join_text(blocks: list[Any]) -> list[Any]:
    """`blocks` with adjacent text blocks joined, then stripped (also inside tool results)."""
    joined: list[Any] = []
    for block in blocks:
        if _is_text(block) and joined and _is_text(joined[-1]):
            joined[-1] = {"type": "text", "text": joined[-1]["text"] + block["text"]}
        elif (
            isinstance(block, dict)
            and block.get("type") == "tool_result"
            and isinstance(block.get("content"), list)
        ):
            joined.append({**block, "content": join_text(block["content"])})
        else:
            joined.append(block)
    return [{"type": "text", "text": block["text"].strip()} if _is_text(block) else block for block in joined]


def text_block(text: Any) -> dict[str, Any]:
    """``{"type": "text", "text"}`` (stripped when `message` / `join_text` join the blocks)."""
    return {"type": "text", "text": text if isinstance(text, str) else str(text)}


def tool_call(name: Any, arguments: Any) -> dict[str, Any]:
    """``{"type": "tool_call", "name", "arguments"}``; string arguments are parsed when JSON."""
    if isinstance(arguments, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            arguments = orjson.loads(arguments)
    return {"type": "tool_call", "name": clean(name), "arguments": clean(arguments)}


def tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    """A function tool in the common shape."""
    return {"name": clean(name), "description": clean(description), "parameters": clean(parameters)}


def _is_text(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and set(block) == {"type", "text"}
        and isinstance(block["text"], str)
    )
