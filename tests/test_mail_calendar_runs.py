"""``mail-calendar`` end to end with the real ``reroll run``: the framework starts the mail
service and gates the agent on its health, the oracle reaches 1.0 on each backend, and the scripted
Claude Code solves it through the ``mail`` MCP server (its recording shows the MCP tool calls and
their results from the service)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_example_tasks import EXAMPLES, REROLL, oracle_run

TASK = EXAMPLES / "mail-calendar"
pytestmark = pytest.mark.slow


def test_oracle_reaches_reward_one(sandbox_backend: str, tmp_path: Path) -> None:
    oracle_run(TASK, sandbox_backend, tmp_path)


def test_scripted_claude_code_solves_it_through_the_mcp_tools(sandbox_backend: str, tmp_path: Path) -> None:
    if sandbox_backend != "local":
        pytest.skip("Claude Code's MCP wiring is the same on every backend: once is enough")
    done = subprocess.run(
        [REROLL, "run", str(TASK), "--agent", "claude-code", "--model", "scripted",
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
    calls = [
        block["name"]
        for line in exchanges
        for block in line["response"]["body"]["content"]
        if block["type"] == "tool_use"
    ]
    assert calls == [f"mcp__mail__{tool}" for tool in ("list_messages", "read_message", "read_message",
                     "list_events", "archive_message", "reply_to_message", "book_event")]  # fmt: skip
    last = exchanges[-1]["request"]["body"]["messages"][-1]["content"]
    (booked,) = [block for block in last if block["type"] == "tool_result"]
    assert not booked.get("is_error") and "Project sync with Bob" in json.dumps(booked["content"])
