"""The agent phase of a rollout (`reroll.rollout.lifecycle`): the agent installed into the
shared agents folder, the environment it runs with (`stable_agent_env`, and what the extensions
add before each launch: `reroll.rollout.hooks.Extension.before_turn`), and one turn of it
launched, watched until it exits, times out or the proxy stops it, its output kept in the run
folder with a short tail (`output_tail`) in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from reroll_contracts.errors import AgentInstallError, SidecarError
from reroll_contracts.proxy import ProxyStop
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.host.llm_proxy import LlmProxy
from reroll.installs.store import ensure_installed, provide_runtime
from reroll.rollout.hooks import Run, TurnLaunch
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.runfolder.agent_log import AgentLog
from reroll.runfolder.run import AGENT_LOG, RunConfig
from reroll.sandbox.base import Sandbox
from reroll.sandbox.results import ExecResult
from reroll.tasks.compat import resolve_env

INSTALL_TIMEOUT_SECONDS = 900.0


async def install_agent(sandbox: Sandbox, agent: AgentSpec, env: dict[str, str], console: Console) -> None:
    """Install `agent` once per install key in a step of its own, and check the install before
    this rollout uses it (`reroll.installs.store`: the rollout's sandbox sees it read-only).

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
    script = agent.install_script
    if script is None:
        return

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


async def run_agent(run: Run, agent: AgentSpec, prompt: str, resume: bool) -> AgentOutcome:
    """Launch `agent` told `prompt` (its ``resume`` command when `resume`: multi-turn; a process
    tree restored instead when an extension says so, `TurnLaunch.restored`) and wait
    for it to exit, time out, or be stopped by the proxy's stop: one turn
    (`reroll.rollout.turns.scenes.TurnRunner`; `reroll.rollout.lifecycle` binds the arguments before
    `agent`).

    Args:
        run: the running rollout (its sandbox with the agent installed, plan, proxy, environment
            ``env | task_env | agent_env``, extensions, console).
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
    sandbox, plan, proxy, console = run.sandbox, run.plan, run.proxy, run.console
    layout = sandbox.layout
    launch = TurnLaunch(agent, run.env | run.task_env | run.agent_env, resume)
    await run.hooks.before_turn(run, launch)  # MCP servers, ask_user, a restored session's resume
    prompt = "\n\n".join([prompt, *launch.notes])
    agent_env = await _launch_env(run, launch, prompt)
    outcome = AgentOutcome()
    console.print(f"running {agent.name} (timeout {plan.timeout_seconds:.0f} s)")
    # The whole output goes to the run folder's log (capped), only a short tail stays in memory.
    with AgentLog(plan.paths.agent_log) as log:

        def write_output(_stream: str, chunk: bytes) -> None:
            log.write(chunk)

        command = agent.resume if launch.resume and agent.resume else agent.launch
        launched = asyncio.create_task(
            launch.restored(write_output, plan.timeout_seconds)  # a restored tree: waited for
            if launch.restored is not None
            else sandbox.exec(
                ["sh", "-c", command],
                cwd=layout.workspace,
                env=agent_env,
                inherit_env=False,
                user=layout.agent_user,
                timeout_seconds=plan.timeout_seconds,
                on_output=write_output,
            )
        )
        run.launched.set()  # its start is done: the job's other rollouts may start theirs
        stop = None if proxy is None else await _agent_or_stop(launched, proxy)
        if stop is not None:
            launched.cancel()
            with contextlib.suppress(asyncio.CancelledError, SidecarError):
                await launched
            # A step limit ends the agent as a timeout does: the verify that follows needs the services.
            await sandbox.kill(spare_services=stop.kind == "step_limit")
        if not launched.cancelled():
            executed = await launched
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


async def _launch_env(run: Run, launch: TurnLaunch, prompt: str) -> dict[str, str]:
    """The environment `launch`'s agent runs with, its prompt file written and, for an agent that
    needs the task's solution (the oracle), the solution uploaded: the launch's own variables, the
    lineage's stable ones (`stable_agent_env`), reroll's ``REROLL_*``, the solution's ``env`` and
    the agent's LLM variables pointing at the proxy.

    Raises:
        TaskError: ``solution.env`` names a variable the host lacks.
        SandboxError: the sandbox failed a write.
    """
    sandbox, plan, proxy, agent = run.sandbox, run.plan, run.proxy, launch.agent
    layout = sandbox.layout
    prompt_file = f"{layout.logs_dir}/agent/prompt.txt"
    await sandbox.put_file(prompt_file, prompt.encode())
    agent_env = {
        **launch.env,
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
    return agent_env


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


async def _agent_or_stop(run: asyncio.Task[ExecResult], proxy: LlmProxy) -> ProxyStop | None:
    """Wait for the agent's `run` to end or the proxy to stop (pushed by its long poll).

    Returns:
        None when the agent ended first; the proxy's stop when it stopped first (the agent is
        still running).

    Raises:
        InfrastructureError: the proxy died while the agent ran.
    """
    stop = asyncio.create_task(proxy.wait_for_stop())
    try:
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not run.done():
        return stop.result()  # raises when the proxy died
    if stop.done() and not stop.cancelled():
        stop.exception()  # retrieved here; a dead proxy fails the status read that follows
    return None


OUTPUT_TAIL_LINES = 3
OUTPUT_TAIL_CHARS = 400


def output_tail(output: str) -> str:
    """The last `OUTPUT_TAIL_LINES` non-empty lines of `output`, joined with `` | ``, at most
    `OUTPUT_TAIL_CHARS` characters (the end kept): what a failed agent said last."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    joined = " | ".join(lines[-OUTPUT_TAIL_LINES:])
    return joined if len(joined) <= OUTPUT_TAIL_CHARS else "…" + joined[-OUTPUT_TAIL_CHARS:]
