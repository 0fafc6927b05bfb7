"""The task's services and MCP servers as a rollout extension: every agent checked against the
MCP servers it must take before anything is written; the services provisioned once the sandbox
started, the agent held until they are ready (the readiness gate) and the task's setup commands
ran (`reroll.environment.setup`), torn down before the sandbox
stops and checked alive after the agent; each launch given its native MCP configuration
(`reroll.environment.services`, `reroll.rollout.mcp`); a trial scene's ``reset_environment``
returns the environment to the baseline copied after the setup commands."""

from __future__ import annotations

import time

from rich.console import Console

from reroll.agents import AgentSpec
from reroll.environment.services import Environment
from reroll.environment.setup import run_setup_commands
from reroll.rollout.hooks import Draft, Extension, Run, TurnLaunch
from reroll.rollout.mcp import (
    BRIDGE_COMMAND,
    BRIDGE_SOURCE,
    FILTER_SOURCE,
    MCP_CONFIG_ENV,
    behind_filter,
    bridge_note,
    bridge_wrapper,
    describe,
    mcp_servers_for,
    needs_filter,
    render_mcp_config,
)
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.sandbox.base import Sandbox
from reroll.tasks.environment import McpServerSpec
from reroll.tasks.manifest import PERSISTENT_NOTE


class ServicesAndMcp(Extension):
    """Reads the task's ``environment.services`` and ``environment.mcp_servers``."""

    def __init__(self) -> None:
        self.environment: Environment | None = None
        self.withheld: list[str] = []
        """The task's MCP servers withheld from the agents (``--without-mcp``), by name."""

    def configure(self, draft: Draft) -> None:
        """Refuse an agent without the MCP client the task's servers need; with ``--without-mcp``
        (config.json's ``without_mcp``), withhold them from every agent instead.

        Raises:
            AgentError: an agent cannot take the task's MCP servers that are not optional
                (`reroll.rollout.mcp.mcp_servers_for`), and ``--without-mcp`` is not given.
        """
        servers = draft.task.spec.environment.mcp_servers
        if draft.config.without_mcp:
            self.withheld = [server.name for server in servers]
            return
        for agent in draft.agents.values():
            mcp_servers_for(agent, servers)

    async def after_sandbox_start(self, run: Run) -> None:
        """Provision the services and wait until they are ready; their environment goes into
        ``run.task_env``; their teardown runs before the sandbox stops."""
        plan = run.plan
        environment = Environment(run.sandbox, plan.task, plan.run_dir, run.env | run.task_env)
        run.stack.push_async_callback(environment.teardown)  # before the sandbox stops
        await _provision(environment, run.console)
        run.task_env |= environment.exec_env()
        self.environment = environment
        setup = plan.task.spec.environment.setup_commands
        await run_setup_commands(run.sandbox, setup, run.env | run.task_env, plan.run_dir, run.console)
        if any(scene.reset_environment for scene in plan.trial.scenes[1:]):
            await environment.capture_baseline()  # what a scene's reset returns to

    async def before_agent(self, run: Run) -> None:
        """Give the scheduler the environment's reset (a scene's ``reset_environment``).
        ``--without-mcp``: result.json's ``mcp_withheld`` names the servers withheld, and the
        console says so."""
        if self.environment is not None and run.trial is not None:
            run.trial.reset_environment = self.environment.reset
        if self.withheld:
            run.result.mcp_withheld = self.withheld
            run.console.print(
                f"[yellow]--without-mcp: the agents run without the task's MCP servers "
                f"{', '.join(self.withheld)}[/yellow]"
            )

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        """Write the agent's native MCP configuration offering the task's servers (none withheld
        by ``--without-mcp``) and the others of the launch; its path into the launch's environment."""
        task_servers = [] if self.withheld else run.plan.task.spec.environment.mcp_servers
        servers = [*task_servers, *launch.mcp_servers]
        launch.env |= await _offer_mcp(run.sandbox, launch.agent, servers, run.console)
        if launch.agent.mcp is None and MCP_CONFIG_ENV in launch.env:
            await _offer_bridge(run.sandbox, launch, mcp_servers_for(launch.agent, servers))

    async def after_agent(self, run: Run, outcome: AgentOutcome) -> None:
        """Fail the rollout when a service died while the agent ran (not after a replay's stop,
        which killed every process, services too).

        Raises:
            ServiceCrashedError: a service is gone.
        """
        if outcome.status.stop is None and self.environment is not None:
            await self.environment.check_alive()


async def _provision(environment: Environment, console: Console) -> None:
    """Start the task's services and hold the rollout until all are ready (the readiness gate:
    `reroll.environment.services`); nothing to do for a task without any."""
    spec = environment.spec
    if spec.isolation == "persistent":
        console.print(f"[yellow]isolation = persistent {PERSISTENT_NOTE}[/yellow]")
    if not environment.declared:
        return
    names = ", ".join(service.name for service in spec.services) or "the image's own"
    if spec.endpoints():
        names += f"; endpoints {', '.join(spec.endpoints())}"
    timeout = environment.spec.readiness.timeout_sec
    console.print(f"[dim]starting services ({names}); the agent waits until ready (≤ {timeout:g} s)[/dim]")
    gate = time.monotonic()
    await environment.provision()
    await environment.wait_ready()
    console.print(f"[dim]services ready after {time.monotonic() - gate:.1f} s[/dim]")


async def _offer_mcp(
    sandbox: Sandbox, agent: AgentSpec, servers: list[McpServerSpec], console: Console
) -> dict[str, str]:
    """Write `agent`'s native MCP configuration offering `servers` (those it can take,
    `reroll.rollout.mcp.mcp_servers_for`) into the sandbox's agent logs; the environment naming
    it (``$REROLL_MCP_CONFIG``), empty when the agent gets none. A stdio server with a tool filter
    the configuration cannot say is started behind reroll's filter, copied beside it
    (`reroll.rollout.mcp.needs_filter`)."""
    given = mcp_servers_for(agent, servers)
    left_out = [server.name for server in servers if server not in given]
    if left_out and agent.api_format != "none":
        missing = ", ".join(left_out)
        console.print(f"[yellow]{agent.name} runs without the optional MCP servers {missing}[/yellow]")
    if any(needs_filter(agent, server) for server in given):
        script = f"{sandbox.layout.logs_dir}/agent/mcp/{FILTER_SOURCE.name}"
        await sandbox.put_file(script, FILTER_SOURCE.read_bytes())
        given = [behind_filter(server, script) if needs_filter(agent, server) else server for server in given]
    config = render_mcp_config(agent, given)
    if config is None:
        return {}
    path = f"{sandbox.layout.logs_dir}/agent/mcp/{config.filename}"
    await sandbox.put_file(path, config.text.encode())
    console.print(f"[dim]MCP servers for {agent.name}: {describe(given)}[/dim]")
    return {MCP_CONFIG_ENV: path}


async def _offer_bridge(sandbox: Sandbox, launch: TurnLaunch, servers: list[McpServerSpec]) -> None:
    """Give `launch`'s agent (no MCP client) reroll's bridge to `servers`: the bridge and the
    filter beside the ``bridge.json`` `_offer_mcp` wrote, ``mcp-call`` in a folder put first on its
    ``PATH``, and (a new session only) the note naming the tools, each server listed through the
    bridge itself as the agent's user (`reroll.rollout.mcp.bridge_note`)."""
    folder = f"{sandbox.layout.logs_dir}/agent/mcp"
    await sandbox.put_file(f"{folder}/{BRIDGE_SOURCE.name}", BRIDGE_SOURCE.read_bytes())
    await sandbox.put_file(f"{folder}/{FILTER_SOURCE.name}", FILTER_SOURCE.read_bytes())
    await sandbox.put_file(f"{folder}/bin/{BRIDGE_COMMAND}", bridge_wrapper(folder).encode(), mode=0o755)
    launch.env["PATH"] = f"{folder}/bin:{launch.env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
    if launch.resume:
        return
    env = launch.env | {"REROLL_AGENT_HOME": f"{sandbox.layout.agents_dir}/{launch.agent.install_key}"}
    listings: dict[str, str] = {}
    for server in servers:
        listed = await sandbox.exec(
            [BRIDGE_COMMAND, server.name, "--list"],
            cwd=sandbox.layout.workspace, env=env, inherit_env=False,
            user=sandbox.layout.agent_user, timeout_seconds=120,
        )  # fmt: skip
        if listed.exit_code == 0:
            listings[server.name] = listed.stdout.decode("utf-8", "replace").strip()
    launch.notes.append(bridge_note(servers, listings))
