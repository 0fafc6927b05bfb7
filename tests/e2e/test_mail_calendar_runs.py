"""``mail-calendar`` end to end with the real ``reroll run``: the framework starts the mail
service and gates the agent on its health, the oracle reaches 1.0 on each backend (and, on docker,
in the task's compose form, the service a sibling container built from the same folder), and the
scripted Claude Code and Codex solve it through the ``mail`` MCP server (their recordings show the
MCP tool calls and their results from the service), and the scripted mini-swe-agent, which has no
MCP client, through reroll's bridge (``mcp-call``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import labelled_containers
from tests.e2e.test_example_tasks import EXAMPLES, REROLL, oracle_run

TASK = EXAMPLES / "mail-calendar"
COMPOSE_TASK = EXAMPLES / "mail-calendar-compose"
TOOLS = ["list_messages", "read_message", "read_message", "list_events", "archive_message",
         "reply_to_message", "book_event"]  # fmt: skip
pytestmark = pytest.mark.slow


def test_oracle_reaches_reward_one(sandbox_backend: str, tmp_path: Path) -> None:
    oracle_run(TASK, sandbox_backend, tmp_path)


def test_the_compose_form_runs_the_service_as_a_sibling_container(
    sandbox_backend: str, tmp_path: Path
) -> None:
    """Harbor's compose form: the ``mail`` service is built from the original's folder (compose's
    ``build``), runs beside the sandbox, is reached by its name and gates the agent on its
    healthcheck; the verifier asks it for the state."""
    if sandbox_backend != "docker":
        pytest.skip("image services are sibling containers: docker only")
    output = oracle_run(COMPOSE_TASK, sandbox_backend, tmp_path)
    assert "starting services (mail)" in output
    (run,) = (tmp_path / "j").iterdir()
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert (record["name"], record["runs"]) == ("mail", "image") and record["ready_at"] is not None
    log = (run / "services" / "mail.log").read_text()
    assert "mail service on 0.0.0.0:9001" in log and "POST /events" in log  # the oracle's calls, by name
    assert "PASS: Bob's sync booked at 11:30" in (run / "verifier" / "test-stdout.txt").read_text()
    assert labelled_containers(run.name) == []  # the sibling removed with the sandbox


def _claude_code_calls(exchanges: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Claude Code's tool calls (``mcp__<server>__<tool>``) and the last tool result."""
    calls = [
        block["name"]
        for line in exchanges
        for block in line["response"]["body"]["content"]
        if block["type"] == "tool_use"
    ]
    last = exchanges[-1]["request"]["body"]["messages"][-1]["content"]
    (booked,) = [block for block in last if block["type"] == "tool_result"]
    assert not booked.get("is_error")
    return calls, json.dumps(booked["content"])


def _codex_calls(exchanges: list[dict[str, Any]]) -> tuple[list[str], str]:
    """Codex's tool calls (a Responses ``function_call`` in the namespace ``mcp__<server>``, named
    here ``<namespace>__<tool>``) and the last tool result."""
    calls = [
        f"{item['namespace']}__{item['name']}"
        for line in exchanges
        for item in line["response"]["body"]["output"]
        if item["type"] == "function_call"
    ]
    outputs = [
        item for item in exchanges[-1]["request"]["body"]["input"] if item["type"] == "function_call_output"
    ]
    return calls, json.dumps(outputs[-1]["output"])


def _mini_swe_agent_calls(exchanges: list[dict[str, Any]]) -> tuple[list[str], str]:
    """mini-swe-agent's bridge calls (``mcp-call mail TOOL``, from its bash commands, named here
    ``mcp__mail__<tool>``) and the output of the last one."""
    calls = []
    for line in exchanges:
        for tool_call in line["response"]["body"]["choices"][0]["message"].get("tool_calls") or []:
            command = json.loads(tool_call["function"]["arguments"])["command"]
            for part in command.split(" && "):
                if part.startswith("mcp-call "):
                    calls.append("mcp__" + "__".join(part.split()[1:3]))
    booked = exchanges[-1]["request"]["body"]["messages"][-1]["content"]
    assert '"returncode": 0' in booked
    return calls, booked


def test_the_bridge_is_named_after_the_instruction(tmp_path: Path) -> None:
    pass


@pytest.mark.parametrize("agent", ["claude-code", "codex", "mini-swe-agent"])
def test_a_scripted_agent_solves_it_through_the_mcp_tools(
    agent: str, sandbox_backend: str, tmp_path: Path
) -> None:
    if sandbox_backend != "local":
        pytest.skip("an agent's MCP wiring is the same on every backend: once is enough")
    done = subprocess.run(
        [REROLL, "run", str(TASK), "--agent", agent, "--model", "scripted",
         "--sandbox", sandbox_backend,
         "--jobs-dir", str(tmp_path), "--job-name", "j"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}, result.get("error")
    exchanges = [
        json.loads(line) for line in (run / "trajectory" / "llm_trajectory.jsonl").read_text().splitlines()
    ]
    readers = {
        "claude-code": _claude_code_calls,
        "codex": _codex_calls,
        "mini-swe-agent": _mini_swe_agent_calls,
    }
    calls, booked = readers[agent](exchanges)
    if agent == "mini-swe-agent":  # told how to reach the tools, each named
        told = exchanges[0]["request"]["body"]["messages"][-1]["content"]
        assert "`mcp-call SERVER --list`" in told and "book_event: Book a calendar event" in told
    assert calls == [f"mcp__mail__{tool}" for tool in TOOLS]
    assert "Project sync with Bob" in booked
