"""The bundled tasks' scripts for Claude Code, without the agent: the scripted model is fed
requests shaped like Claude Code 2.1.327's (captured from the CLI: a ``role: system`` message
inside ``messages``, ``?beta=true``, its tool schemas) and must answer every turn with tool calls
Claude Code accepts (a tool it offers, the required inputs, no unknown input), and route
subagents to their threads."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from reroll_contracts.wire import format_named
from reroll_proxy.scripted import answer_for, load_script
from reroll_proxy.scripted_answers import answer_body, turn_index

from tests.agents.subagents import SUBAGENTS_SCRIPT, answered_by

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "tasks"
SCHEMAS: dict[str, tuple[set[str], set[str]]] = {
    "Agent": (
        {"description", "effort", "isolation", "model", "prompt", "run_in_background", "subagent_type"},
        {"description", "prompt"},
    ),
    "Bash": (
        {"command", "dangerouslyDisableSandbox", "description", "run_in_background", "timeout"},
        {"command"},
    ),
    "Edit": (
        {"file_path", "new_string", "old_string", "replace_all"},
        {"file_path", "old_string", "new_string"},
    ),
    "Read": ({"allow_large", "file_path", "limit", "offset", "pages"}, {"file_path"}),
    "Write": ({"content", "file_path"}, {"file_path", "content"}),
}
"""Claude Code's own tools as its requests declare them: (properties, required); no other
property is allowed (``additionalProperties: false``)."""
WIRE = format_named("anthropic-messages")


def claude_code_request(prompt: str, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """A request shaped like Claude Code's after `turns` (assistant answers, each followed by its results)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution for git commits…\n</system-reminder>\n"},
            {"type": "text", "text": prompt, "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "system", "content": "# Environment\n - Primary working directory: /app"},
    ]  # fmt: skip
    for answer in turns:
        messages.append({"role": "assistant", "content": answer["content"]})
        results = [
            {"type": "tool_result", "tool_use_id": block["id"], "content": "ok"}
            for block in answer["content"]
            if block["type"] == "tool_use"
        ]
        if results:
            messages.append({"role": "user", "content": results})
    tools = [{"name": name, "description": name, "input_schema": {"type": "object"}} for name in SCHEMAS]
    system = [{"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."}]
    return {"model": "scripted", "messages": messages, "system": system, "tools": tools, "stream": True}


def play(script_path: Path, prompt: str) -> list[dict[str, Any]]:
    """Every answer of the script's main thread to Claude Code-shaped requests, until a turn
    without tool calls (the agent stops there)."""
    script = load_script(script_path)
    answers: list[dict[str, Any]] = []
    while True:
        request = claude_code_request(prompt, answers)
        thread, turns, _ = script.thread_for(WIRE.normalise(request), "scripted")
        index = turn_index(WIRE.name, request)
        assert thread == "" and index < len(turns), f"{script_path}: no turn {index}"
        answers.append(answer_body(WIRE.name, answer_for(turns[index], index, thread), request))
        if answers[-1]["stop_reason"] != "tool_use":
            return answers


def assert_accepted(answers: list[dict[str, Any]]) -> list[str]:
    """Every tool call is one Claude Code accepts; returns the tools called, in order."""
    called = []
    for answer in answers:
        for block in answer["content"]:
            if block["type"] == "tool_use":
                properties, required = SCHEMAS[block["name"]]
                assert required <= set(block["input"]) <= properties, block
                called.append(block["name"])
    return called


@pytest.mark.parametrize(
    ("task", "tools"),
    [
        ("fix-failing-test", ["Read", "Bash", "Edit", "Bash"]),
        ("hello-file", ["Write", "Bash"]),
    ],
)
def test_each_task_script_drives_claude_codes_tools(task: str, tools: list[str]) -> None:
    script = EXAMPLES / task / "scripted-model.claude-code.yaml"
    answers = play(script, "Do the task.")
    assert assert_accepted(answers) == tools
    assert answers[-1]["stop_reason"] == "end_turn" and answers[-1]["content"][-1]["text"]


def test_fix_failing_test_edit_fixes_the_bug() -> None:
    answers = play(EXAMPLES / "fix-failing-test" / "scripted-model.claude-code.yaml", "Fix it.")
    (edit,) = [b["input"] for a in answers for b in a["content"] if b.get("name") == "Edit"]
    source = (EXAMPLES / "fix-failing-test" / "environment" / "workspace" / "calc.py").read_text()
    assert source.count(edit["old_string"]) == 1  # Edit refuses an ambiguous or missing old_string
    fixed = source.replace(edit["old_string"], edit["new_string"])
    namespace: dict[str, Any] = {}
    exec(compile(fixed, "calc.py", "exec"), namespace)
    assert namespace["mean"]([1, 2, 3]) == 2


def test_subagents_get_their_own_threads(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "subagents.yaml"
    path.write_text(yaml.safe_dump(SUBAGENTS_SCRIPT))
    script = load_script(path)
    main = claude_code_request("Create hello.txt", [])
    first = answer_body(WIRE.name, answer_for(script.turns[0], 0), main)
    assert assert_accepted([first]) == ["Agent", "Agent"]
    for call in (b for b in first["content"] if b["type"] == "tool_use"):
        subagent = claude_code_request(call["input"]["prompt"], [])
        thread, turns, _ = script.thread_for(WIRE.normalise(subagent), "scripted")
        answer = answer_body(WIRE.name, answer_for(turns[0], 0, thread), subagent)
        assert answered_by(answer) == (thread, 0) and thread in call["input"]["prompt"].lower()
        assert assert_accepted([answer]) == ["Bash"]


def test_mail_calendar_script_calls_the_mail_mcp_servers_tools_as_declared() -> None:
    """Every call is ``mcp__mail__<tool>`` (Claude Code's name for an MCP tool) of a tool the task's
    MCP server lists, with its required inputs and no other."""
    task = EXAMPLES / "mail-calendar"
    server = runpy.run_path(str(task / "environment" / "workspace" / ".services" / "mail" / "mcp_server.py"))
    schemas = {tool["name"]: tool["inputSchema"] for tool in server["TOOLS"]}
    answers = play(task / "scripted-model.claude-code.yaml", "Do the task.")
    called = []
    for block in (b for answer in answers for b in answer["content"] if b["type"] == "tool_use"):
        prefix, _, tool = block["name"].rpartition("__")
        assert prefix == "mcp__mail" and tool in schemas, block["name"]
        assert (
            set(schemas[tool].get("required", [])) <= set(block["input"]) <= set(schemas[tool]["properties"])
        )
        called.append(tool)
    assert called == ["list_messages", "read_message", "read_message", "list_events",
                      "archive_message", "reply_to_message", "book_event"]  # fmt: skip
    assert answers[-1]["stop_reason"] == "end_turn"
