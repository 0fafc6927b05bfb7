"""The task's MCP servers in each agent's native MCP configuration, and the refusal of an agent
that cannot take them. The rendered files are read back by the agents' own parsers where the
agent is installed on this machine (Claude Code's ``mcp add-json``/``mcp get``, Codex's ``mcp
list --json``), else checked against the documented shapes."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from reroll.agents import get_agent
from reroll.cache import cache_dir
from reroll.rollout.mcp import (
    behind_filter,
    bridge_note,
    bridge_wrapper,
    mcp_servers_for,
    needs_filter,
    optional_warnings,
    render_mcp_config,
)
from reroll.tasks.environment import McpServerSpec
from reroll.tasks.task import load_task
from reroll_contracts.errors import AgentError

STDIO = McpServerSpec(
    name="mail",
    transport="stdio",
    command="python3",
    args=["/app/.services/mail/mcp_server.py", "--url", "http://localhost:9001"],
    env={"MAIL_TOKEN": 'a "quoted" value'},
    tools=["list_messages", "archive_message"],
)
IN_FOLDER = STDIO.model_copy(update={"name": "cal", "cwd": "/srv/cal", "tools": None, "env": {}})
HTTP = McpServerSpec.model_validate(  # benchflow's ``http``: streamable HTTP
    {
        "name": "remote",
        "transport": "http",
        "url": "http://mail:9001/mcp",
        "headers": {"Authorization": "Bearer t"},
    }
)
SSE = McpServerSpec(name="events", transport="sse", url="http://localhost:9002/sse")


def installed(agent: str, *relative: str) -> Path:
    """The installed agent's program, or a skip when this machine has not installed it."""
    program = cache_dir() / "agents" / get_agent(agent).install_key / Path(*relative)
    if not program.exists():
        pytest.skip(f"{agent} is not installed on this machine ({program})")
    return program


def test_claude_code_gets_an_mcp_config_json_file() -> None:
    config = render_mcp_config(get_agent("claude-code"), [STDIO, IN_FOLDER, HTTP, SSE])
    assert config is not None and config.filename == "mcp.json"
    servers = json.loads(config.text)["mcpServers"]
    assert servers["mail"] == {
        "type": "stdio",
        "command": "python3",
        "args": ["/app/.services/mail/mcp_server.py", "--url", "http://localhost:9001"],
        "env": {"MAIL_TOKEN": 'a "quoted" value'},
    }
    # Claude Code's stdio entry has no working folder: a shell changes into it
    assert servers["cal"]["command"] == "sh" and servers["cal"]["args"][2:4] == ["/srv/cal", "python3"]
    assert servers["remote"] == {"type": "http", "url": HTTP.url, "headers": HTTP.headers}
    assert servers["events"]["type"] == "sse"


@pytest.mark.spawns
def test_claude_codes_own_parser_accepts_each_entry(tmp_path: Path) -> None:
    claude = installed("claude-code", "claude")
    config = render_mcp_config(get_agent("claude-code"), [STDIO, IN_FOLDER, HTTP, SSE])
    assert config is not None
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DISABLE_AUTOUPDATER": "1"}
    expected = {"mail": "stdio", "cal": "stdio", "remote": "http", "events": "sse"}
    for name, entry in json.loads(config.text)["mcpServers"].items():
        added = subprocess.run(
            [str(claude), "mcp", "add-json", name, json.dumps(entry)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr + added.stdout
        shown = subprocess.run(
            [str(claude), "mcp", "get", name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"Type: {expected[name]}" in shown.stdout, shown.stdout
    refused = subprocess.run(
        [str(claude), "mcp", "add-json", "bad", json.dumps({"type": "stdio", "args": ["x"]})],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0  # the parser does check: an entry without a command is refused


def test_codex_gets_mcp_servers_tables_with_its_tool_filter() -> None:
    config = render_mcp_config(get_agent("codex"), [STDIO, IN_FOLDER, HTTP])
    assert config is not None and config.filename == "config.toml"
    servers = tomllib.loads(config.text)["mcp_servers"]
    assert servers["mail"] == {
        "command": "python3",
        "args": STDIO.args,
        "env": STDIO.env,
        "enabled_tools": ["list_messages", "archive_message"],
    }
    assert servers["cal"]["cwd"] == "/srv/cal" and servers["cal"]["command"] == "python3"
    assert servers["remote"] == {"url": HTTP.url, "http_headers": HTTP.headers}


@pytest.mark.spawns
def test_codexs_own_parser_reads_the_file(tmp_path: Path) -> None:
    codex = installed("codex", "venv", "bin", "codex")
    config = render_mcp_config(get_agent("codex"), [STDIO, IN_FOLDER, HTTP])
    assert config is not None
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / config.filename).write_text(config.text)
    listed = subprocess.run(
        [str(codex), "mcp", "list", "--json"],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    servers = {server["name"]: server["transport"] for server in json.loads(listed.stdout)}
    assert servers["mail"]["type"] == "stdio" and servers["mail"]["env"] == STDIO.env
    assert servers["cal"]["cwd"] == "/srv/cal"
    assert servers["remote"] == servers["remote"] | {"type": "streamable_http", "http_headers": HTTP.headers}


def test_openhands_gets_its_cli_mcp_json() -> None:
    config = render_mcp_config(get_agent("openhands"), [IN_FOLDER, HTTP, SSE])
    assert config is not None and config.filename == "mcp.json"
    servers = json.loads(config.text)["mcpServers"]
    assert servers["cal"] == {
        "command": "python3",
        "args": IN_FOLDER.args,
        "env": {},
        "cwd": "/srv/cal",
        "transport": "stdio",
    }
    assert servers["remote"] == {"url": HTTP.url, "transport": "http", "headers": HTTP.headers}
    assert servers["events"]["transport"] == "sse"


def test_no_servers_no_file_and_no_config_for_an_agent_that_cannot_take_them() -> None:
    assert render_mcp_config(get_agent("claude-code"), []) is None
    with pytest.raises(AgentError, match="codex cannot take the MCP servers events"):
        render_mcp_config(get_agent("codex"), [STDIO, SSE])


def test_an_agent_without_mcp_gets_every_server_through_the_bridge() -> None:
    """mini-swe-agent and aider have no MCP client: every server goes to reroll's bridge (all
    transports, every filter), whose bridge.json carries each server whole but ``optional``."""
    for agent in ("mini-swe-agent", "aider"):
        assert mcp_servers_for(get_agent(agent), [STDIO, HTTP, SSE]) == [STDIO, HTTP, SSE]
        assert not needs_filter(get_agent(agent), STDIO)  # the bridge filters itself
    config = render_mcp_config(get_agent("mini-swe-agent"), [STDIO, SSE])
    assert config is not None and config.filename == "bridge.json"
    servers = json.loads(config.text)["servers"]
    assert servers["mail"]["tools"] == ["list_messages", "archive_message"]
    assert servers["mail"]["env"] == STDIO.env and servers["events"]["url"] == SSE.url
    assert "optional" not in servers["mail"]
    assert McpServerSpec.model_validate({"name": "mail", **servers["mail"]}) == STDIO


def test_the_bridge_wrapper_and_note() -> None:
    wrapper = bridge_wrapper("/logs/agent/mcp")
    assert wrapper.startswith("#!/bin/sh\n")
    assert 'exec "$py" -B /logs/agent/mcp/mcp_bridge.py /logs/agent/mcp/bridge.json "$@"' in wrapper
    note = bridge_note([STDIO, HTTP], {"mail": "read: Read it.\n  arguments: {}"})
    assert note.startswith("## MCP tools") and "`mcp-call SERVER --list`" in note
    assert "Server `mail`:\n    read: Read it.\n      arguments: {}" in note
    assert "Server `remote`:\n    (`mcp-call remote --list`)" in note  # its listing failed


def test_task_check_warns_of_optional_a_field_benchflow_refuses() -> None:
    servers = [STDIO.model_copy(update={"optional": True}), HTTP]
    (warning,) = optional_warnings(servers)
    assert warning.startswith(f"mcp {STDIO.name}: optional = true") and "--without-mcp" in warning
    assert "mcp-call" in warning
    assert optional_warnings([STDIO, HTTP]) == []


def test_codex_is_refused_an_sse_server_unless_it_is_optional() -> None:
    with pytest.raises(AgentError) as refused:
        mcp_servers_for(get_agent("codex"), [STDIO, SSE])
    assert "'events' (sse), but codex's MCP client speaks only stdio, streamable-http" in str(refused.value)
    assert "(claude-code, openhands, or one without" in str(refused.value)  # the agents that do speak SSE
    optional_sse = SSE.model_copy(update={"optional": True})
    assert mcp_servers_for(get_agent("codex"), [STDIO, optional_sse]) == [STDIO]


def test_the_oracle_calls_no_model_and_needs_no_mcp() -> None:
    assert mcp_servers_for(get_agent("oracle"), [STDIO]) == []


FILTERED_TASK = Path(__file__).parents[1] / "fixtures" / "benchflow-mcp-filters"
"""BenchFlow's task format: a stdio server with ``tools`` and both tag filters, an HTTP one with
``exclude_tags``."""


def filtered_servers() -> tuple[McpServerSpec, McpServerSpec]:
    mail, calendar = load_task(FILTERED_TASK).spec.environment.mcp_servers
    return mail, calendar


def test_openhands_gets_the_tag_filters_in_its_mcp_json_and_reroll_filters_the_names() -> None:
    mail, calendar = filtered_servers()
    openhands = get_agent("openhands")
    assert mcp_servers_for(openhands, [mail, calendar]) == [mail, calendar]
    assert needs_filter(openhands, mail) and not needs_filter(openhands, calendar)
    config = render_mcp_config(openhands, [mail, calendar])
    assert config is not None
    servers = json.loads(config.text)["mcpServers"]
    assert servers["calendar"] == {
        "url": calendar.url,
        "transport": "http",
        "headers": {},
        "exclude_tags": ["write"],
    }
    assert (servers["mail"]["include_tags"], servers["mail"]["exclude_tags"]) == (["inbox"], ["admin"])
    assert "tools" not in servers["mail"]  # FastMCP's `tools` is a map of transforms, not names


def test_claude_code_gets_a_stdio_server_behind_reroll_s_filter() -> None:
    mail, _ = filtered_servers()
    claude = get_agent("claude-code")
    assert needs_filter(claude, STDIO) and needs_filter(claude, mail)
    assert not needs_filter(claude, IN_FOLDER)  # no filter: started as it is
    wrapped = behind_filter(mail, "/logs/agent/mcp/mcp_filter.py")
    config = render_mcp_config(claude, [wrapped])
    assert config is not None
    entry = json.loads(config.text)["mcpServers"]["mail"]
    assert entry["command"] == "python3" and entry["args"][0] == "/logs/agent/mcp/mcp_filter.py"
    filters = {
        "tools": ["list_messages", "archive_message"],
        "include_tags": ["inbox"],
        "exclude_tags": ["admin"],
    }
    assert json.loads(entry["args"][1]) == filters
    assert entry["args"][2:] == ["python3", "/app/mail_mcp.py"]


def test_codex_says_the_name_filter_itself_and_gets_the_tag_filters_from_reroll() -> None:
    mail, _ = filtered_servers()
    codex = get_agent("codex")
    assert not needs_filter(codex, STDIO)  # tools only: enabled_tools
    assert needs_filter(codex, mail)
    config = render_mcp_config(codex, [behind_filter(mail, "/f.py")])
    assert config is not None
    assert tomllib.loads(config.text)["mcp_servers"]["mail"]["enabled_tools"] == [
        "list_messages",
        "archive_message",
    ]


def test_an_http_server_with_a_filter_the_agent_cannot_say_is_refused_unless_optional() -> None:
    mail, calendar = filtered_servers()
    for agent in ("claude-code", "codex"):
        with pytest.raises(AgentError) as refused:
            mcp_servers_for(get_agent(agent), [mail, calendar])
        message = str(refused.value)
        assert f"'calendar' (exclude_tags) filter their tools in a way {agent}'s MCP configuration" in message
        assert "(openhands)" in message and "or pass --without-mcp" in message
    optional = calendar.model_copy(update={"optional": True})
    assert mcp_servers_for(get_agent("claude-code"), [mail, optional]) == [mail]
