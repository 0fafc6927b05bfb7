"""Claude Code with two background subagents: the scripted model's script, and how to tell
which thread a request belongs to and which thread's turn answered it (shared by the end-to-end
test and the script tests)."""

from __future__ import annotations

import json
import re
from typing import Any

SUBAGENTS_SCRIPT = {
    "threads": [
        {
            "name": name,
            "match": {"first_user": f"SUBTASK {name.upper()}"},
            "turns": [
                {
                    "content": f"Writing {name}.txt.",
                    "delay_seconds": delay,
                    "tool_calls": [{"name": "Bash", "arguments": {"command": f"echo {name} > {name}.txt"}}],
                },
                {"content": f"{name}.txt written."},
            ],
        }
        for name, delay in (("alpha", 0.5), ("beta", 0.0))
    ],
    "turns": [
        {
            "content": "I'll hand two parts to background agents.",
            "tool_calls": [
                {
                    "name": "Agent",
                    "arguments": {
                        "description": f"Write {name}",
                        "prompt": f"SUBTASK {name.upper()}: run `echo {name} > {name}.txt`.",
                        "subagent_type": "general-purpose",
                        "run_in_background": True,
                    },
                }
                for name in ("alpha", "beta")
            ],
        },
        {
            "content": "Meanwhile I'll create the file.",
            "tool_calls": [
                {"name": "Write", "arguments": {"file_path": "hello.txt", "content": "Hello, reroll!\n"}}
            ],
        },
        {"content": "Done."},
        {"content": "Done."},
        {"content": "Done."},
    ],
}
"""Main thread: two background subagents (the Agent tool), then a Write; each subagent: one Bash."""


def thread_of(request: dict[str, Any]) -> str:
    """The script thread a recorded request belongs to, from its first user message."""
    first_user = next(m for m in request["messages"] if m["role"] == "user")
    text = json.dumps(first_user["content"])
    return next((name for name in ("alpha", "beta") if f"SUBTASK {name.upper()}" in text), "")


def answered_by(response: dict[str, Any]) -> tuple[str, int]:
    """The script thread and turn that answered (the scripted ids: ``msg_scripted_[T-]k``)."""
    match = re.fullmatch(r"msg_scripted_(?:([a-z]+)-)?(\d+)", response["id"])
    assert match, response["id"]
    return match.group(1) or "", int(match.group(2))
