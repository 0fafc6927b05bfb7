"""Divergence between a replayed request and the recorded one (pure: no I/O).

During replay the agent re-executes its recorded steps for real, so each request should carry
the same conversation as the recorded request the engine matched it with (`reroll_proxy.engine`:
the next exchange of its thread). `compare_requests` says where it does not, in any API format:
the engine first removes the declared volatile parts (`reroll_proxy.volatile`), then both bodies
are normalised to the common shape
of `reroll_contracts.wire.normal` (messages as role + content blocks, tools, model
parameters), which ignores what legitimately varies: ids (response, tool-call, tool-use),
timestamps, ``cache_control``, signatures, whitespace around strings, text split into several
parts, JSON formatting of tool-call arguments, ``model`` (a continuation swaps it), streaming
options and bookkeeping fields (``metadata``, ``user``, ``store``...).

The first difference is reported, looked for in this order: messages (the first differing
message; if one conversation is a prefix of the other, ``message_count``), then ``tools``,
then ``params``. Its classification:

- ``observation_changed``: a ``user`` or ``tool`` message differs (a command's output, a tool
  result, the task text): the world answered differently;
- ``agent_changed``: a ``system`` or ``assistant`` message, the tools or the model parameters
  differ, or the API format itself: the agent asked something else.
"""

from __future__ import annotations

import difflib
from typing import Any

import orjson
from reroll_contracts.proxy import Classification, Divergence
from reroll_contracts.wire import format_named
from reroll_contracts.wire.normal import NormalRequest

MAX_DIFF_LINES = 40
"""Longest `Divergence.diff`, in lines (longer diffs are cut, with a last line saying so)."""
_PREVIEW_CHARS = 60
_OBSERVATION_ROLES = frozenset({"user", "tool"})


def compare_requests(
    recorded_body: dict[str, Any], live_body: dict[str, Any], api_format: str = "openai-chat"
) -> Divergence | None:
    """Compare a recorded and a live request of the same API format.

    Args:
        recorded_body: the recorded request body.
        live_body: the request body the agent sent now.
        api_format: both bodies' format name (see `reroll_contracts.wire`).

    Returns:
        None when the normalised requests are equal, else the first difference.

    Raises:
        KeyError: `api_format` is unknown.
    """
    wire = format_named(api_format)
    return compare_normal(wire.normalise(recorded_body), wire.normalise(live_body))


def format_changed(recorded_format: str, live_format: str) -> Divergence:
    """The divergence of a request sent in another API format than the recorded one."""
    return Divergence(
        message_index=None,
        field="api_format",
        summary=f"the recorded request was {recorded_format}, the live one is {live_format}",
        diff=_unified_diff(recorded_format, live_format, "api_format"),
    )


def compare_normal(recorded: NormalRequest, live: NormalRequest) -> Divergence | None:
    """Compare two normalised requests (see the module docstring for order and classification)."""
    found = _message_divergence(recorded["messages"], live["messages"])
    if found is not None:
        return found
    for key in ("tools", "params"):
        old, new = recorded[key], live[key]
        path = _first_path(old, new, key)
        if path is not None:
            return Divergence(
                message_index=None,
                field=path,
                summary=f"{path} differs",
                diff=_unified_diff(_as_text(old), _as_text(new), key),
            )
    return None


def _message_divergence(recorded: list[dict[str, Any]], live: list[dict[str, Any]]) -> Divergence | None:
    counts = f"; recorded {len(recorded)} messages, live {len(live)}" if len(recorded) != len(live) else ""
    for index, (old, new) in enumerate(zip(recorded, live, strict=False)):
        path = _first_path(old, new, f"messages[{index}]")
        if path is not None:
            role = old.get("role")
            return Divergence(
                message_index=index,
                field=path,
                classification=_classify(role),
                summary=f"{path} differs (role {role!r}){counts}",
                diff=_unified_diff(_as_text(old), _as_text(new), f"messages[{index}]"),
            )
    if not counts:
        return None
    index = min(len(recorded), len(live))
    first_extra = (recorded if len(recorded) > len(live) else live)[index]
    return Divergence(
        message_index=index,
        field="message_count",
        classification=_classify(first_extra.get("role")),
        summary=f"recorded request has {len(recorded)} messages, live request has {len(live)}",
        diff=_unified_diff("\n".join(map(_preview, recorded)), "\n".join(map(_preview, live)), "messages"),
    )


def _classify(role: Any) -> Classification:
    return "observation_changed" if role in _OBSERVATION_ROLES else "agent_changed"


def _first_path(old: Any, new: Any, path: str) -> str | None:
    """The path of the first place where `old` and `new` differ, or None when equal."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_path(old.get(key), new.get(key), f"{path}.{key}")
            if found is not None:
                return found
    if isinstance(old, list) and isinstance(new, list):
        for index, (a, b) in enumerate(zip(old, new, strict=False)):
            found = _first_path(a, b, f"{path}[{index}]")
            if found is not None:
                return found
        return f"{path}[{min(len(old), len(new))}]"
    return path


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"role", "content"}:
        return "\n".join([f"role: {value['role']}", *map(_block_text, value["content"])])
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _block_text(block: Any) -> str:
    if isinstance(block, dict) and block.get("type") == "text":
        return str(block.get("text", ""))
    if (
        isinstance(block, dict)
        and block.get("type") == "tool_result"
        and isinstance(block.get("content"), list)
    ):
        flag = " (error)" if block.get("is_error") else ""
        return "\n".join([f"[tool result{flag}]", *map(_block_text, block["content"])])
    return orjson.dumps(block, option=orjson.OPT_SORT_KEYS).decode()


def _preview(message: dict[str, Any]) -> str:
    text = " ".join(_block_text(block) for block in message.get("content") or []).replace("\n", " ")
    return f"{message.get('role')}: {text[:_PREVIEW_CHARS]}"


def _unified_diff(old: str, new: str, label: str) -> str:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"recorded {label}", f"live {label}", lineterm="", n=2
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[: MAX_DIFF_LINES - 1], f"... ({len(lines) - MAX_DIFF_LINES + 1} more lines)"]
    return "\n".join(lines)
