"""The MCP configuration the services extension writes for a launch: a stdio server with a tool
filter the agent's configuration cannot say is started behind reroll's filter, copied beside it
(a stand-in sandbox that keeps the files written)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reroll.agents import get_agent
from reroll.rollout.extensions.services import _offer_mcp
from reroll.rollout.mcp import FILTER_SOURCE, MCP_CONFIG_ENV
from reroll.tasks.task import load_task
from rich.console import Console

FILTERED_TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-mcp-filters"


class Files:
    """A sandbox that only keeps what is written into it."""

    def __init__(self) -> None:
        self.layout = SimpleNamespace(logs_dir="/logs")
        self.files: dict[str, bytes] = {}

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        self.files[path] = data
        return len(data)


async def offer(agent: str) -> tuple[dict[str, str], Files]:
    mail, _ = load_task(FILTERED_TASK).spec.environment.mcp_servers  # the stdio one
    sandbox = Files()
    sandbox_any: Any = sandbox
    env = await _offer_mcp(sandbox_any, get_agent(agent), [mail], Console(quiet=True))
    return env, sandbox


async def test_claude_code_reaches_a_filtered_server_through_reroll_s_filter() -> None:
    env, sandbox = await offer("claude-code")
    assert env == {MCP_CONFIG_ENV: "/logs/agent/mcp/mcp.json"}
    assert sandbox.files["/logs/agent/mcp/mcp_filter.py"] == FILTER_SOURCE.read_bytes()
    entry = json.loads(sandbox.files["/logs/agent/mcp/mcp.json"])["mcpServers"]["mail"]
    assert entry["args"][0] == "/logs/agent/mcp/mcp_filter.py"
    assert entry["args"][2:] == ["python3", "/app/mail_mcp.py"]


async def test_no_filter_copied_when_the_configuration_says_every_filter() -> None:
    mail, _ = load_task(FILTERED_TASK).spec.environment.mcp_servers
    plain = mail.model_copy(update={"include_tags": None, "exclude_tags": None})
    sandbox = Files()
    sandbox_any: Any = sandbox
    await _offer_mcp(sandbox_any, get_agent("codex"), [plain], Console(quiet=True))
    assert list(sandbox.files) == ["/logs/agent/mcp/config.toml"]  # enabled_tools says `tools`
