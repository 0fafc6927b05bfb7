"""The task's MCP servers (`reroll.tasks.environment.McpServerSpec`) in each agent's native MCP
configuration.

An agent declares in ``agents.yaml`` which configuration it reads (``mcp: claude-code | codex |
openhands``); none means it has no MCP client. `render_mcp_config` turns a list of servers into
that configuration's text; the rollout writes it into the sandbox and names it in
``$REROLL_MCP_CONFIG``, which the agent's ``launch`` passes on (Claude Code's ``--mcp-config``,
Codex's ``$CODEX_HOME/config.toml``, OpenHands' ``~/.openhands/mcp.json``). The formats, read in
November 2026:

- ``claude-code`` — ``claude --mcp-config FILE`` (Claude Code 2.1): ``{"mcpServers": {NAME:
  {"type": "stdio", "command", "args", "env"} | {"type": "sse" | "http", "url", "headers"}}}``;
  no working folder and no tool filter in a server's entry (its ``--allowedTools`` does not restrict
  under ``--dangerously-skip-permissions``, which reroll's launch uses).
- ``codex`` — ``[mcp_servers.NAME]`` tables of ``$CODEX_HOME/config.toml`` (codex 0.147, checked
  with ``codex mcp list --json``): ``command``, ``args``, ``env``, ``cwd`` (stdio) or ``url``,
  ``http_headers`` (streamable HTTP; Codex has no SSE client), and ``enabled_tools``. Codex offers
  a server's tools to the model as one Responses ``namespace`` tool ``mcp__<NAME>`` and runs a
  ``function_call`` only when it names that namespace beside the tool (seen in its recordings).
  No tag filter.
- ``openhands`` — ``~/.openhands/mcp.json`` of the OpenHands CLI 1.x (``openhands_cli/mcp/
  mcp_utils.py``, FastMCP's ``MCPConfig``): ``{"mcpServers": {NAME: {"command", "args", "env",
  "cwd", "transport": "stdio"} | {"url", "transport": "http" | "sse", "headers"}}}``, plus
  FastMCP's ``include_tags`` and ``exclude_tags`` (as BenchFlow writes them). Its ``tools`` is
  FastMCP's map of tool transforms, not a list of names: no name filter.

Tool filters (``tools``, ``include_tags``, ``exclude_tags``; BenchFlow 0.7.11 hands them to the
agent's MCP client as they are): each goes into the configuration where it can say it (above).
A stdio server with a filter its agent's configuration cannot say is started behind reroll's
filter (`reroll.rollout.mcp_filter`, run by the sandbox's ``python3``), which applies all of its
filters; an sse or streamable-HTTP one cannot be, so that agent is refused it (`mcp_servers_for`).

An agent with no MCP client of its own (``mcp`` unset: mini-swe-agent, aider) gets reroll's MCP
bridge (`reroll.rollout.mcp_bridge`): a command-line MCP client, ``mcp-call``, put on its
``PATH`` with a JSON file of the servers (`bridge_files`), and a note after its instruction naming
each server's tools and how to call them (`bridge_note`). The bridge speaks every transport and
applies every filter itself. (BenchFlow 0.7.11 has no such agents: each of its agents is an ACP
agent handed the servers in ``session/new`` or a native file; one that ignores them runs without.)

A server a native client cannot take (a transport it lacks, or an sse/HTTP server with a filter
its configuration cannot say) refuses the task before anything starts, unless the server is
``optional``: then the agent runs without it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reroll_contracts.errors import AgentError

from reroll.agents import AgentSpec, McpFormat
from reroll.tasks.environment import McpServerSpec

MCP_CONFIG_ENV = "REROLL_MCP_CONFIG"
"""The variable naming the rendered configuration file in the sandbox, for the agent's ``launch``;
unset when the agent gets no MCP server."""

Transport = Literal["stdio", "sse", "streamable-http"]
Filter = Literal["tools", "include_tags", "exclude_tags"]

FILTER_SOURCE = Path(__file__).with_name("mcp_filter.py")
"""reroll's MCP tool filter, copied into the sandbox for the servers `needs_filter` names (and
beside the bridge, which imports it)."""
BRIDGE_SOURCE = Path(__file__).with_name("mcp_bridge.py")
"""reroll's MCP bridge (`reroll.rollout.mcp_bridge`), copied into the sandbox for an agent with no
MCP client."""
BRIDGE_COMMAND = "mcp-call"
"""The bridge's command on the agent's ``PATH``."""


@dataclass(frozen=True)
class McpConfig:
    """An agent's MCP configuration, rendered."""

    filename: str
    """The file's name (``mcp.json``, ``config.toml``): where it goes is the agent's launch's business."""
    text: str
    """Its content."""


def _stdio_in(server: McpServerSpec) -> tuple[str, list[str]]:
    """`server`'s command and arguments, started in its ``cwd`` by a shell when it names one (for
    clients whose configuration has no working folder)."""
    if server.cwd is None:
        return server.command or "", server.args
    return "sh", ["-c", 'cd "$0" && exec "$@"', server.cwd, server.command or "", *server.args]


def _claude_code(servers: list[McpServerSpec]) -> McpConfig:
    entries: dict[str, dict[str, Any]] = {}
    for server in servers:
        if server.transport == "stdio":
            command, args = _stdio_in(server)
            entries[server.name] = {"type": "stdio", "command": command, "args": args, "env": server.env}
        else:
            kind = "sse" if server.transport == "sse" else "http"
            entries[server.name] = {"type": kind, "url": server.url, "headers": server.headers}
    return McpConfig("mcp.json", json.dumps({"mcpServers": entries}, indent=2))


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string (same escapes)


def _toml_inline(values: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in values.items()) + "}"


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_toml_string(value) for value in values) + "]"


def _codex(servers: list[McpServerSpec]) -> McpConfig:
    tables: list[str] = []
    for server in servers:
        lines = [f"[mcp_servers.{_toml_string(server.name)}]"]
        if server.transport == "stdio":
            lines += [f"command = {_toml_string(server.command or '')}", f"args = {_toml_list(server.args)}"]
            if server.env:
                lines.append(f"env = {_toml_inline(server.env)}")
            if server.cwd:
                lines.append(f"cwd = {_toml_string(server.cwd)}")
        else:
            lines.append(f"url = {_toml_string(server.url or '')}")
            if server.headers:
                lines.append(f"http_headers = {_toml_inline(server.headers)}")
        if server.tools is not None:
            lines.append(f"enabled_tools = {_toml_list(server.tools)}")  # the tag filters: reroll's
        tables.append("\n".join(lines))
    return McpConfig("config.toml", "\n\n".join(tables) + "\n")


def _openhands(servers: list[McpServerSpec]) -> McpConfig:
    entries: dict[str, dict[str, Any]] = {}
    for server in servers:
        if server.transport == "stdio":
            entries[server.name] = {
                "command": server.command,
                "args": server.args,
                "env": server.env,
                "transport": "stdio",
            } | ({"cwd": server.cwd} if server.cwd else {})
        else:
            kind = "sse" if server.transport == "sse" else "http"
            entries[server.name] = {"url": server.url, "transport": kind, "headers": server.headers}
        tags = {name: value for name, value in server.filters.items() if name != "tools"}
        entries[server.name] |= tags  # the name filter: reroll's
    return McpConfig("mcp.json", json.dumps({"mcpServers": entries}, indent=2))


@dataclass(frozen=True)
class _Client:
    transports: frozenset[Transport]
    render: Callable[[list[McpServerSpec]], McpConfig]
    filters: frozenset[Filter]
    """The tool filters its configuration can say."""


def _bridge(servers: list[McpServerSpec]) -> McpConfig:
    entries = {server.name: server.model_dump(mode="json", exclude={"optional"}) for server in servers}
    return McpConfig("bridge.json", json.dumps({"servers": entries}, indent=2))


_BRIDGE = _Client(
    frozenset({"stdio", "sse", "streamable-http"}),
    _bridge,
    frozenset({"tools", "include_tags", "exclude_tags"}),
)
"""reroll's bridge (`reroll.rollout.mcp_bridge`): the client of an agent that has none."""

_CLIENTS: dict[McpFormat, _Client] = {
    "claude-code": _Client(frozenset({"stdio", "sse", "streamable-http"}), _claude_code, frozenset()),
    "codex": _Client(frozenset({"stdio", "streamable-http"}), _codex, frozenset({"tools"})),
    "openhands": _Client(
        frozenset({"stdio", "sse", "streamable-http"}),
        _openhands,
        frozenset({"include_tags", "exclude_tags"}),
    ),
}


def _client(agent: AgentSpec) -> _Client:
    """`agent`'s MCP client: its native one, else reroll's bridge."""
    return _CLIENTS[agent.mcp] if agent.mcp else _BRIDGE


def _unsaid(client: _Client, server: McpServerSpec) -> list[str]:
    """The filters of `server` that `client`'s configuration cannot say."""
    return [name for name in server.filters if name not in client.filters]


def needs_filter(agent: AgentSpec, server: McpServerSpec) -> bool:
    """Whether `server` reaches `agent` only through reroll's filter (`reroll.rollout.mcp_filter`):
    a stdio server with a filter `agent`'s MCP configuration cannot say."""
    client = _CLIENTS[agent.mcp] if agent.mcp else None
    return client is not None and server.transport == "stdio" and bool(_unsaid(client, server))


def behind_filter(server: McpServerSpec, script: str) -> McpServerSpec:
    """`server` (stdio) started by reroll's filter at `script` (a path in the sandbox), which
    applies all of its filters; the same name, env and folder."""
    command = [json.dumps(server.filters), server.command or "", *server.args]
    return server.model_copy(update={"command": "python3", "args": [script, *command]})


WITHOUT_MCP_FLAG = "--without-mcp"
"""The flag that runs the agents without the task's MCP servers
(`reroll.settings.RolloutSettings.without_mcp`)."""


def mcp_servers_for(agent: AgentSpec, servers: list[McpServerSpec]) -> list[McpServerSpec]:
    """The servers of `servers` that `agent` gets: all of them, less the ``optional`` ones its MCP
    client cannot take (or whose filters neither its configuration nor reroll's filter can
    apply); every one for an agent without an MCP client (reroll's bridge takes them all); none
    for an agent that calls no model (``api_format: none``, the oracle).

    Raises:
        AgentError: a server that is not ``optional`` cannot be given to `agent` (its native
            client lacks that transport, or it is an sse/HTTP server with a filter its
            configuration cannot say); the message names the agent, the servers and the ways out:
            an agent that can, or ``--without-mcp``.
    """
    if agent.api_format == "none":  # the oracle: it calls no model, so it uses no tools
        return []
    client = _client(agent)
    given = [server for server in servers if server.transport in client.transports]
    unfiltered = [server for server in given if server.transport != "stdio" and _unsaid(client, server)]
    given = [server for server in given if server not in unfiltered]
    if refused := [server for server in unfiltered if not server.optional]:
        names = ", ".join(f"{server.name!r} ({', '.join(_unsaid(client, server))})" for server in refused)
        able = ", ".join(
            sorted(
                name
                for name, other in _CLIENTS.items()
                if all(
                    server.transport in other.transports and not _unsaid(other, server) for server in refused
                )
            )
        )
        raise AgentError(
            f"the task's MCP servers {names} filter their tools in a way {agent.name}'s MCP configuration "
            f"cannot say, and reroll filters only stdio servers itself: run it with an agent that can "
            f"({able or 'none'}), or pass {WITHOUT_MCP_FLAG} to run it without them"
        )
    refused = [
        server
        for server in servers
        if server not in given and server not in unfiltered and not server.optional
    ]
    if refused:
        names = ", ".join(f"{server.name!r} ({server.transport})" for server in refused)
        why = f"{agent.name}'s MCP client speaks only {', '.join(sorted(client.transports))}"
        needed = {server.transport for server in refused}
        able = ", ".join(sorted(name for name, other in _CLIENTS.items() if needed <= other.transports))
        raise AgentError(
            f"the task offers its tools over MCP servers {names}, but {why}: run it with an agent "
            f"that takes them ({able}, or one without an MCP client, which gets reroll's bridge), or "
            f"pass {WITHOUT_MCP_FLAG} to run it without them (a baseline: the task's tools out of its reach)"
        )
    return given


def render_mcp_config(agent: AgentSpec, servers: list[McpServerSpec]) -> McpConfig | None:
    """`agent`'s MCP configuration offering `servers` (the one function to call for any agent;
    `mcp_servers_for` first picks what it gets): its native one, or the bridge's ``bridge.json``
    for an agent without an MCP client.

    Returns:
        The configuration, or None when `servers` is empty (the agent gets no MCP file).

    Raises:
        AgentError: `agent`'s client lacks a server's transport.
    """
    if not servers:
        return None
    client = _client(agent)
    if unfit := [server.name for server in servers if server.transport not in client.transports]:
        raise AgentError(f"{agent.name} cannot take the MCP servers {', '.join(unfit)}")
    return client.render(servers)


def bridge_wrapper(folder: str) -> str:
    """The ``mcp-call`` script (sh) for a bridge copied into `folder` of the sandbox (beside its
    ``bridge.json`` and the filter): it runs the bridge with the agent's own Python when it has
    one (``$REROLL_AGENT_HOME/venv``, a Python agent's), else the sandbox's ``python3``."""
    bridge, config = shlex.quote(f"{folder}/{BRIDGE_SOURCE.name}"), shlex.quote(f"{folder}/bridge.json")
    return (
        "#!/bin/sh\n"
        'py="$REROLL_AGENT_HOME/venv/bin/python3"\n'
        '[ -x "$py" ] || py=python3\n'
        f'exec "$py" -B {bridge} {config} "$@"\n'
    )


def bridge_note(servers: list[McpServerSpec], listings: dict[str, str]) -> str:
    """The note after an agent's instruction when it reaches `servers` through the bridge: how to
    list and call the tools, and each server's tools as ``mcp-call SERVER --list`` printed them
    (`listings`, by server name; a server missing there is named only)."""
    lines = [
        "## MCP tools",
        "",
        f"This task offers tools over MCP. Call them from the shell with `{BRIDGE_COMMAND}`:",
        "",
        f"- `{BRIDGE_COMMAND} SERVER --list` lists a server's tools and their arguments (JSON Schema);",
        f'- `{BRIDGE_COMMAND} SERVER TOOL \'{{"name": "value"}}\'` calls a tool with its arguments as one',
        "  JSON object and prints its result (exit status 1 when the tool reports an error).",
    ]
    for server in servers:
        lines += ["", f"Server `{server.name}`:"]
        listing = listings.get(server.name)
        shown = listing.splitlines() if listing else [f"(`{BRIDGE_COMMAND} {server.name} --list`)"]
        lines += [f"    {line}" for line in shown]
    return "\n".join(lines)


def describe(servers: list[McpServerSpec]) -> str:
    """One line naming `servers` for the console (``mail (stdio: python3 /app/mcp.py)``)."""
    return ", ".join(
        f"{server.name} ({server.transport}: "
        f"{shlex.join([server.command or '', *server.args]) if server.transport == 'stdio' else server.url})"
        for server in servers
    )


def optional_warnings(servers: list[McpServerSpec]) -> list[str]:
    """``reroll task check``'s warnings of `servers` marked ``optional`` (reroll's own field):
    BenchFlow's checker rejects a task that sets it (its ``MCPServerConfig`` has no such field),
    so a task meant for both says ``--without-mcp`` at run time instead."""
    return [
        f"mcp {server.name}: optional = true is reroll's own field (BenchFlow refuses the task); "
        f"an agent without an MCP client reaches it through reroll's bridge ({BRIDGE_COMMAND}), and "
        f"{WITHOUT_MCP_FLAG} runs any agent without it"
        for server in servers
        if server.optional
    ]
