"""The agent phase of a rollout (`reroll.rollout.lifecycle`): the agent installed into the
shared agents folder, the environment it runs with (`stable_agent_env`, the interceptor's CA and
proxy settings, its native MCP configuration), and one turn of it launched, watched until it
exits, times out or the proxy stops it, its output kept in the run folder with a short tail
(`output_tail`) in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import urllib.parse
from typing import TYPE_CHECKING

from reroll_contracts.errors import AgentInstallError, SidecarError
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.host import intercept
from reroll.host.llm_proxy import LlmProxy
from reroll.rollout.asks import offer_ask_user
from reroll.rollout.mcp import MCP_CONFIG_ENV, describe, mcp_servers_for, render_mcp_config
from reroll.rollout.scenes import AgentOutcome
from reroll.runfolder.agent_log import AgentLog
from reroll.runfolder.run import AGENT_LOG, RunConfig
from reroll.sandbox.base import Sandbox
from reroll.sandbox.installs import ensure_installed, provide_runtime
from reroll.sandbox.results import ExecResult
from reroll.tasks.compat import resolve_env
from reroll.tasks.environment import McpServerSpec

if TYPE_CHECKING:
    from reroll.rollout.plan import RolloutPlan

INSTALL_TIMEOUT_SECONDS = 900.0
INTERCEPT_CA_PATH = "/etc/reroll/intercept-ca.pem"
"""Where the CA bundle of an intercepted agent goes (under the sandbox root)."""


async def install_agent(sandbox: Sandbox, agent: AgentSpec, env: dict[str, str], console: Console) -> None:
    """Install `agent` once per install key in a step of its own, and check the install before
    this rollout uses it (`reroll.sandbox.installs`: the rollout's sandbox sees it read-only).

    Args:
        sandbox: the rollout's sandbox, started.
        agent: the agent; nothing to do when it has no ``install`` script.
        env: the base environment of the install script (``REROLL_AGENT_HOME`` and, for an agent
            with a ``python`` runtime, ``REROLL_PYTHON`` are added).
        console: where progress goes.

    Raises:
        AgentInstallError: the install script exited non-zero (its output's last 3000 characters
            in the message) or ran past `INSTALL_TIMEOUT_SECONDS`.
    """
    if agent.install is None:
        return
    script = agent.install

    async def install(installer: Sandbox, home: str) -> list[str]:
        install_env, requires = {**env, "REROLL_AGENT_HOME": home}, list[str]()
        if agent.python is not None:
            python, requires = await provide_runtime(installer, agent.python, env, console.print)
            install_env["REROLL_PYTHON"] = python
        async with installer.egress() as egress_env:
            result = await installer.exec(
                ["sh", "-c", f"(set -e\n{script}\n)"],
                env={**install_env, **egress_env},
                inherit_env=False,
                timeout_seconds=INSTALL_TIMEOUT_SECONDS,
            )
        if result.exit_code != 0:
            raise AgentInstallError(
                f"installing {agent.name} failed (exit {result.exit_code}):\n{result.output_text()[-3000:]}"
            )
        return requires

    await ensure_installed(sandbox, agent.install_key, install, console.print)


async def intercept_agent(
    sandbox: Sandbox, interceptor: intercept.Interceptor, proxy: LlmProxy
) -> dict[str, str]:
    """Put the CA bundle into `sandbox` at `INTERCEPT_CA_PATH`; the environment that sends the
    agent through `interceptor` (``HTTPS_PROXY``, the CA variables: `reroll.host.intercept.sandbox_env`),
    the proxy's own host left out of it."""
    ca_path = sandbox.layout.path(INTERCEPT_CA_PATH)
    await sandbox.put_file(ca_path, intercept.ca_bundle())
    proxy_host = urllib.parse.urlsplit(proxy.base_url).hostname or ""
    return intercept.sandbox_env(interceptor.proxy_url, ca_path, no_proxy=[proxy_host])


async def run_agent(
    sandbox: Sandbox,
    plan: RolloutPlan,
    proxy: LlmProxy | None,
    env: dict[str, str],
    console: Console,
    agent: AgentSpec,
    prompt: str,
    resume: bool,
) -> AgentOutcome:
    """Launch `agent` told `prompt` (its ``resume`` command when `resume`: multi-turn) and wait
    for it to exit, time out, or be stopped by the proxy's stop: one turn
    (`reroll.rollout.scenes.TurnRunner`; `reroll.rollout.lifecycle` binds the arguments before
    `agent`).

    Args:
        sandbox: the rollout's sandbox, the agent installed.
        plan: the rollout (timeout, task, model name, ask_user, restored checkpoint).
        proxy: the rollout's LLM proxy; None for an agent that calls no model.
        env: the environment the agent's launch adds to (the sandbox's, the task's, interception).
        console: where progress goes.
        agent: the agent of this turn.
        prompt: what it is told (written to ``agent/prompt.txt`` in the sandbox's logs).
        resume: run its ``resume`` command (a later turn of the same session).

    Returns:
        How the turn ended: exit code, timed out, output tail, and the proxy's status (its stop,
        when it stopped the agent).

    Raises:
        InfrastructureError: the proxy died while the agent ran.
        SandboxError: the sandbox failed the launch.
    """
    layout = sandbox.layout
    resume = resume or plan.restore_from is not None  # forked: every turn continues the restored session
    prompt_file = f"{layout.logs_dir}/agent/prompt.txt"
    await sandbox.put_file(prompt_file, prompt.encode())
    agent_env = {
        **env,
        **stable_agent_env(plan.config),
        "REROLL_AGENT_HOME": f"{layout.agents_dir}/{agent.install_key}",
        "REROLL_PROMPT_FILE": prompt_file,
    }
    if agent.needs_solution and plan.task.solution_dir is not None:
        solution_dir = layout.path(plan.task.solution_mount)
        await sandbox.upload_dir(plan.task.solution_dir, solution_dir)
        agent_env["REROLL_SOLUTION_DIR"] = solution_dir
        agent_env |= resolve_env(plan.task.spec.solution.env, os.environ, "solution.env")
    if proxy is not None:
        agent_env |= agent.launch_env(base_url=proxy.base_url, api_key=proxy.token, model=plan.agent_model)
    servers = plan.task.spec.environment.mcp_servers
    if plan.asks is not None and proxy is not None and agent.api_format != "none":
        servers = [*servers, await offer_ask_user(sandbox, proxy)]
    agent_env |= await _offer_mcp(sandbox, agent, servers, console)
    outcome = AgentOutcome()
    console.print(f"running {agent.name} (timeout {plan.timeout_seconds:.0f} s)")
    # The whole output goes to the run folder's log (capped), only a short tail stays in memory.
    with AgentLog(plan.run_dir / AGENT_LOG) as log:

        def write_output(_stream: str, chunk: bytes) -> None:
            log.write(chunk)

        run = asyncio.create_task(
            sandbox.exec(
                ["sh", "-c", agent.resume if resume and agent.resume else agent.launch],
                cwd=layout.workspace,
                env=agent_env,
                inherit_env=False,
                user=layout.agent_user,
                timeout_seconds=plan.timeout_seconds,
                on_output=write_output,
            )
        )
        if proxy is not None and not await _agent_or_stop(run, proxy):
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError, SidecarError):
                await run
            await sandbox.kill()
        if not run.cancelled():
            executed = await run
            outcome.exit_code = executed.exit_code
            outcome.timed_out = executed.timed_out
            outcome.output_tail = output_tail(executed.output_text())
    if log.dropped:
        console.print(
            f"[yellow]{agent.name}'s output cut: {AGENT_LOG} keeps the first {log.limit} bytes, "
            f"{log.dropped} more were dropped[/yellow]"
        )
    if proxy is not None:
        # Read after the agent is gone: the proxy sets its stop before it sends the 409 that tells
        # the agent, so an agent that exits right after that 409 still gets its run stopped.
        outcome.status = await proxy.status()
    return outcome


AGENT_IDENTITY = {"name": "reroll agent", "email": "agent@reroll.invalid", "user": "agent"}
"""Who the agent is, the same in every sandbox: git's author and committer, ``USER``/``LOGNAME``."""


def stable_agent_env(config: RunConfig) -> dict[str, str]:
    """Environment that makes what the agent sees the same in every sandbox of a run's lineage.

    git's author and committer (name, e-mail, date: the lineage's first start,
    ``config.lineage_started_at``), so commits an agent makes (aider's, after each edit) get the
    same ids in the recording and its replay; ``USER`` and ``LOGNAME``. Empty dates (a config
    without any start time) are left to git.
    """
    name, email = AGENT_IDENTITY["name"], AGENT_IDENTITY["email"]
    env = {"USER": AGENT_IDENTITY["user"], "LOGNAME": AGENT_IDENTITY["user"]}
    for role in ("AUTHOR", "COMMITTER"):
        env |= {f"GIT_{role}_NAME": name, f"GIT_{role}_EMAIL": email}
        if date := config.lineage_started_at or config.started_at:
            env[f"GIT_{role}_DATE"] = date
    return env


async def _offer_mcp(
    sandbox: Sandbox, agent: AgentSpec, servers: list[McpServerSpec], console: Console
) -> dict[str, str]:
    """Write `agent`'s native MCP configuration offering `servers` (those it can take,
    `reroll.rollout.mcp.mcp_servers_for`) into the sandbox's agent logs; the environment naming
    it (``$REROLL_MCP_CONFIG``), empty when the agent gets none."""
    given = mcp_servers_for(agent, servers)
    left_out = [server.name for server in servers if server not in given]
    if left_out and agent.api_format != "none":
        missing = ", ".join(left_out)
        console.print(f"[yellow]{agent.name} runs without the optional MCP servers {missing}[/yellow]")
    config = render_mcp_config(agent, given)
    if config is None:
        return {}
    path = f"{sandbox.layout.logs_dir}/agent/mcp/{config.filename}"
    await sandbox.put_file(path, config.text.encode())
    console.print(f"[dim]MCP servers for {agent.name}: {describe(given)}[/dim]")
    return {MCP_CONFIG_ENV: path}


async def _agent_or_stop(run: asyncio.Task[ExecResult], proxy: LlmProxy) -> bool:
    """Wait for the agent's `run` to end or the proxy to stop (pushed by its long poll).

    Returns:
        True when the agent ended first; False when the proxy stopped first (the agent is still running).

    Raises:
        InfrastructureError: the proxy died while the agent ran.
    """
    stop = asyncio.create_task(proxy.wait_for_stop())
    try:
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not run.done():
        stop.result()  # raises when the proxy died
        return False
    if stop.done() and not stop.cancelled():
        stop.exception()  # retrieved here; a dead proxy fails the status read that follows
    return True


OUTPUT_TAIL_LINES = 3
OUTPUT_TAIL_CHARS = 400


def output_tail(output: str) -> str:
    """The last `OUTPUT_TAIL_LINES` non-empty lines of `output`, joined with `` | ``, at most
    `OUTPUT_TAIL_CHARS` characters (the end kept): what a failed agent said last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    joined = " | ".join(lines[-OUTPUT_TAIL_LINES:])
    return joined if len(joined) <= OUTPUT_TAIL_CHARS else "…" + joined[-OUTPUT_TAIL_CHARS:]
