"""Divergence between a replayed request and the recorded one (pure: no I/O).

During replay the agent re-executes its recorded steps for real, so its request at step k
should carry the same conversation as the recording's request k. `compare_requests` says
where it does not. Only the ``messages`` are compared, after this normalisation:

- of each message only ``role``, ``content``, ``tool_calls`` and ``tool_call_id`` count; other
  keys (``name``, ``cache_control``, provider extras) are ignored;
- strings lose leading and trailing whitespace;
- a content given as a list of parts is reduced to its parts' ``type`` and ``text`` /
  ``image_url`` (so ``cache_control`` on a part is ignored), and a list made only of text parts
  equals the string of its texts joined;
- a tool call counts by its ``id`` (replay serves the recorded ids, so they must match), its
  function ``name`` and its ``arguments``, the latter compared as parsed JSON when they parse.

The model name, sampling parameters and tool definitions are not compared: swapping the model
is what a continuation does.
"""

from __future__ import annotations

import difflib
from typing import Any

import orjson
from pydantic import BaseModel

MAX_DIFF_LINES = 40
"""Longest `Divergence.diff`, in lines (longer diffs are cut, with a last line saying so)."""
_PREVIEW_CHARS = 60


class Divergence(BaseModel):
    """Where a live request first differs from the recorded one."""

    message_index: int | None
    """0-based index of the first differing message; None when the difference is not in a message."""
    field: str
    """What differs: ``message_count``, or ``messages[i].role`` / ``.content`` / ``.tool_calls`` /
    ``.tool_call_id``."""
    summary: str
    """One line for humans."""
    diff: str
    """Unified diff (recorded → live) of the differing values, at most `MAX_DIFF_LINES` lines."""


_FIELDS = ("role", "content", "tool_calls", "tool_call_id")


def compare_requests(recorded_body: dict[str, Any], live_body: dict[str, Any]) -> Divergence | None:
    """Compare the conversations of a recorded and a live Chat Completions request.

    The message count is checked first (the summary then also names the first differing
    message, if any); with equal counts the first differing message field is reported.

    Args:
        recorded_body: the recorded request body.
        live_body: the request body the agent sent now.

    Returns:
        None when the normalised conversations are equal, else the first difference.
    """
    recorded = [_normalise_message(m) for m in _messages(recorded_body)]
    live = [_normalise_message(m) for m in _messages(live_body)]
    first = _first_difference(recorded, live)
    if len(recorded) != len(live):
        where = f"; first difference at messages[{first[0]}].{first[1]}" if first else ""
        return Divergence(
            message_index=first[0] if first else min(len(recorded), len(live)),
            field="message_count",
            summary=f"recorded request has {len(recorded)} messages, live request has {len(live)}{where}",
            diff=_unified_diff(
                "\n".join(map(_preview, recorded)), "\n".join(map(_preview, live)), "messages"
            ),
        )
    if first is None:
        return None
    index, field = first
    old, new = recorded[index].get(field), live[index].get(field)
    return Divergence(
        message_index=index,
        field=f"messages[{index}].{field}",
        summary=f"messages[{index}].{field} differs (role {live[index].get('role')!r})",
        diff=_unified_diff(_as_text(old), _as_text(new), f"messages[{index}].{field}"),
    )


def _messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    return messages if isinstance(messages, list) else []


def _first_difference(recorded: list[dict[str, Any]], live: list[dict[str, Any]]) -> tuple[int, str] | None:
    for index, (old, new) in enumerate(zip(recorded, live, strict=False)):
        for field in _FIELDS:
            if old.get(field) != new.get(field):
                return index, field
    return None


def _normalise_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"content": _normalise_value(message)}
    normal = {
        "role": _normalise_value(message.get("role")),
        "content": _normalise_content(message.get("content")),
        "tool_calls": [_normalise_tool_call(call) for call in message.get("tool_calls") or []] or None,
        "tool_call_id": _normalise_value(message.get("tool_call_id")),
    }
    return {key: value for key, value in normal.items() if value is not None}


def _normalise_content(content: Any) -> Any:
    if not isinstance(content, list):
        return _normalise_value(content)
    parts = [
        {key: _normalise_value(part[key]) for key in ("type", "text", "image_url") if key in part}
        if isinstance(part, dict)
        else _normalise_value(part)
        for part in content
    ]
    if all(isinstance(part, dict) and part.get("type") == "text" for part in parts):
        return "".join(str(part.get("text", "")) for part in parts).strip()
    return parts


def _normalise_tool_call(call: Any) -> Any:
    if not isinstance(call, dict):
        return _normalise_value(call)
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            arguments = arguments.strip()
    return {"id": call.get("id"), "name": function.get("name"), "arguments": arguments}


def _normalise_value(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {key: _normalise_value(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalise_value(item) for item in value]
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _preview(message: dict[str, Any]) -> str:
    text = _as_text(message.get("content")).replace("\n", " ")
    calls = message.get("tool_calls")
    suffix = f" [+{len(calls)} tool call(s)]" if calls else ""
    return f"{message.get('role')}: {text[:_PREVIEW_CHARS]}{suffix}"


def _unified_diff(old: str, new: str, label: str) -> str:
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"recorded {label}", f"live {label}", lineterm="", n=2
        )
    )
    if len(lines) > MAX_DIFF_LINES:
        lines = [*lines[: MAX_DIFF_LINES - 1], f"... ({len(lines) - MAX_DIFF_LINES + 1} more lines)"]
    return "\n".join(lines)
