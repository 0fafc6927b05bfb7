"""One rollout's lifecycle: setup → start → install → execute → verify → cleanup.

`execute_rollout` drives it for a fresh recording (`reroll run`) and for a continuation
(`reroll continue`, which adds a `ReplayPlan`): the live model and the LLM proxy are started on
the host, the sandbox and its sidecar next, the agent is installed and launched with the proxy's
URL and token, and the result and the run folder are written whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from reroll_proxy.exchange import load_trajectory
from rich.console import Console

from reroll import intercept
from reroll.agents import AgentSpec
from reroll.errors import AgentError, InfrastructureError, RerollError
from reroll.llm_proxy import LlmProxy, ProxyStatus, ReplayPlan
from reroll.models import ModelSpec, live_upstream
from reroll.runfolder import TRAJECTORY, RunConfig, RunResult, count_exchanges, now_iso, write_json
from reroll.sandbox.base import WITHOUT_NETWORK_POLICY, Sandbox, create_sandbox
from reroll.sandbox.files import upload_dir, workspace_manifest
from reroll.sandbox.sidecar_client import SidecarError
from reroll.tasks import Task
from reroll.verify import prepare, verify

INSTALL_TIMEOUT_SECONDS = 900.0
POLL_SECONDS = 0.25
INTERCEPT_CA_PATH = "/etc/reroll/intercept-ca.pem"
"""Where the CA bundle of an intercepted agent goes (under the sandbox root)."""


@dataclass
class RolloutPlan:
    """Everything one rollout needs; `config` is written to config.json as it is."""

    task: Task
    agent: AgentSpec
    prompt: str
    """The prompt the agent gets (for a continuation: the original's, from prompts.json)."""
    agent_model: str
    """The model name the agent asks for (a continuation keeps the original's)."""
    live_model: ModelSpec | None
    """The live upstream, or None (replay only, or an agent that calls no model)."""
    timeout_seconds: float
    run_dir: Path
    config: RunConfig
    sandbox_backend: str = "local"
    replay: ReplayPlan | None = None
    start_gate: asyncio.Semaphore | None = None
    """Held while the model server, LLM proxy and sandbox start (a job bounds how many rollouts
    start at once, so start-up timeouts are not hit when many start together); None: no bound."""


@dataclass
class AgentOutcome:
    """How the agent phase ended."""

    exit_code: int | None = None
    timed_out: bool = False
    stop_reason: str | None = None
    """Why the controller stopped the agent early (strict divergence, replay-only cut point)."""
    status: ProxyStatus = field(default_factory=ProxyStatus)


def new_run_id() -> str:
    """A short random id for a rollout (8 hex digits)."""
    return uuid.uuid4().hex[:8]


async def execute_rollout(plan: RolloutPlan, console: Console) -> RunResult:
    """Run one rollout end to end and write its run folder.

    config.json and prompts.json are written first; result.json last, also when the rollout
    failed (status ``error`` with the cause). Exchanges are written by the proxy as they happen.

    Returns:
        The result as written to result.json.
    """
    started = time.monotonic()
    result = RunResult(started_at=now_iso())
    write_json(plan.run_dir / "config.json", plan.config)
    write_json(plan.run_dir / "prompts.json", [plan.prompt])
    harness_dir = plan.run_dir / "harness"
    harness_dir.mkdir(exist_ok=True)
    try:
        async with contextlib.AsyncExitStack() as stack:
            sandbox = create_sandbox(plan.sandbox_backend, plan.task, plan.run_dir.name)
            stack.push_async_callback(sandbox.stop)
            async with plan.start_gate or contextlib.nullcontext():
                proxy, interceptor = await _start_llm_side(plan, sandbox, stack, harness_dir, console)
                network = f"network {plan.task.spec.environment.network}"
                if plan.sandbox_backend in WITHOUT_NETWORK_POLICY:
                    network = "the host's network"
                console.print(f"[dim]starting {plan.sandbox_backend} sandbox ({network})[/dim]")
                await sandbox.start()
            env = sandbox_env(sandbox)
            await _install_agent(sandbox, plan.agent, env, console)
            await prepare(sandbox, plan.task, env)
            agent_env: dict[str, str] = {}
            if interceptor is not None and proxy is not None:
                agent_env = await _intercept_agent(sandbox, interceptor, proxy)
            result.timings.setup_seconds = round(time.monotonic() - started, 3)
            outcome = await _run_agent(sandbox, plan, proxy, env | agent_env, console)
            result.timings.agent_seconds = round(time.monotonic() - started - result.timings.setup_seconds, 3)
            if proxy is not None:
                # Stopped now, so no response the agent never received gets recorded later.
                await proxy.stop()
                result.counts = count_exchanges(load_trajectory(plan.run_dir / TRAJECTORY))
            manifest = await workspace_manifest(sandbox.client, sandbox.layout.workspace, env)
            write_json(plan.run_dir / "workspace_manifest.json", manifest)
            _apply_outcome(result, outcome, plan)
            if outcome.stop_reason is None:
                console.print("[dim]verifying[/dim]")
                verdict = await verify(sandbox, plan.task, env, plan.run_dir / "verifier")
                result.rewards = verdict.rewards
                result.timings.verifier_seconds = round(verdict.duration_seconds, 3)
    except (RerollError, SidecarError) as exc:
        result.status = "error"
        result.error = str(exc)
        category = "infrastructure" if isinstance(exc, InfrastructureError) else type(exc).__name__
        result.error_category = result.error_category or category
    finally:
        trajectory = plan.run_dir / TRAJECTORY
        if result.counts.exchanges == 0 and trajectory.exists():  # ended early: count what was recorded
            with contextlib.suppress(ValueError):
                result.counts = count_exchanges(load_trajectory(trajectory))
        result.finished_at = now_iso()
        result.timings.total_seconds = round(time.monotonic() - started, 3)
        write_json(plan.run_dir / "result.json", result)
    return result


async def _start_llm_side(
    plan: RolloutPlan,
    sandbox: Sandbox,
    stack: contextlib.AsyncExitStack,
    harness_dir: Path,
    console: Console,
) -> tuple[LlmProxy | None, intercept.Interceptor | None]:
    """Start the live model, the LLM proxy and, for ``proxy_mode: intercept``, its HTTPS front end,
    each stopped by `stack`; (None, None) for an agent that calls no model."""
    if plan.agent.api_format == "none":
        return None, None
    upstream = None
    if plan.live_model is not None:
        upstream = await stack.enter_async_context(live_upstream(plan.live_model, harness_dir))
    host = await sandbox.host_address()
    proxy = LlmProxy(
        workdir=harness_dir,
        trajectory_path=plan.run_dir / TRAJECTORY,
        upstream=upstream,
        replay=plan.replay,
        listen_host=host,
        faults=plan.config.faults,
    )
    await stack.enter_async_context(proxy)
    if plan.agent.proxy_mode != "intercept":
        return proxy, None
    console.print("[dim]starting the HTTPS interceptor (mitmproxy; installed on first use)[/dim]")
    interceptor = intercept.Interceptor(
        target=proxy.base_url,
        token=proxy.token,
        workdir=harness_dir,
        listen_host=host,
        other_hosts="pass" if plan.task.spec.environment.network == "full" else "refuse",
    )
    await stack.enter_async_context(interceptor)
    return proxy, interceptor


def sandbox_env(sandbox: Sandbox) -> dict[str, str]:
    """The base environment of every process the controller starts in `sandbox` (PATH, locale, layout)."""
    layout = sandbox.layout
    # The interpreter reroll runs on comes first, so `python3` works even where PATH holds shims.
    python_bin = str(Path(sys.base_prefix) / "bin")
    return {
        "PATH": f"{python_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        **layout.env(),
    }


async def _intercept_agent(
    sandbox: Sandbox, interceptor: intercept.Interceptor, proxy: LlmProxy
) -> dict[str, str]:
    """Put the CA bundle into `sandbox`; the environment that sends the agent through `interceptor`."""
    ca_path = sandbox.layout.path(INTERCEPT_CA_PATH)
    await sandbox.client.put_file(ca_path, intercept.ca_bundle())
    proxy_host = urllib.parse.urlsplit(proxy.base_url).hostname or ""
    return intercept.sandbox_env(interceptor.proxy_url, ca_path, no_proxy=[proxy_host])


async def _install_agent(sandbox: Sandbox, agent: AgentSpec, env: dict[str, str], console: Console) -> None:
    """Install `agent` once per install key, under a lock so concurrent rollouts share the install."""
    if agent.install is None:
        return
    home = f"{sandbox.layout.agents_dir}/{agent.install_key}"
    installed = await sandbox.client.exec(["test", "-f", f"{home}/.installed"], inherit_env=False)
    if installed.exit_code == 0:
        return
    script = (
        f'mkdir -p "{home}" && exec 9>"{home}.lock" && flock 9 && '
        f'if [ ! -f "{home}/.installed" ]; then echo "installing {agent.name} into {home}" >&2; '
        f'(set -e\n{agent.install}\n) && touch "{home}/.installed" || {{ rm -rf "{home}"; exit 1; }}; fi'
    )
    with console.status(f"installing {agent.name} (first time only)"):
        async with sandbox.egress() as egress_env:
            result = await sandbox.client.exec(
                ["sh", "-c", script],
                env={**env, **egress_env, "REROLL_AGENT_HOME": home},
                inherit_env=False,
                timeout_seconds=INSTALL_TIMEOUT_SECONDS,
            )
    if result.exit_code != 0:
        raise AgentError(
            f"installing {agent.name} failed (exit {result.exit_code}):\n{result.output_text()[-3000:]}"
        )


async def _run_agent(
    sandbox: Sandbox, plan: RolloutPlan, proxy: LlmProxy | None, env: dict[str, str], console: Console
) -> AgentOutcome:
    """Launch the agent and wait for it to exit, time out, or be stopped by the proxy's state."""
    layout = sandbox.layout
    client = sandbox.client
    prompt_file = f"{layout.logs_dir}/agent/prompt.txt"
    await client.put_file(prompt_file, plan.prompt.encode())
    agent_env = {
        **env,
        "REROLL_AGENT_HOME": f"{layout.agents_dir}/{plan.agent.install_key}",
        "REROLL_PROMPT_FILE": prompt_file,
    }
    if plan.agent.needs_solution and plan.task.solution_dir is not None:
        solution_dir = layout.path(plan.task.solution_mount)
        await upload_dir(client, plan.task.solution_dir, solution_dir)
        agent_env["REROLL_SOLUTION_DIR"] = solution_dir
    if proxy is not None:
        agent_env |= plan.agent.launch_env(
            base_url=proxy.base_url, api_key=proxy.token, model=plan.agent_model
        )
    log_dir = plan.run_dir / "agent"
    log_dir.mkdir(exist_ok=True)
    outcome = AgentOutcome()
    console.print(f"running {plan.agent.name} (timeout {plan.timeout_seconds:.0f} s)")
    with open(log_dir / "output.log", "ab") as log:

        def write_output(_stream: str, chunk: bytes) -> None:
            log.write(chunk)
            log.flush()

        run = asyncio.create_task(
            client.exec(
                ["sh", "-c", plan.agent.launch],
                cwd=layout.workspace,
                env=agent_env,
                inherit_env=False,
                user=layout.agent_user,
                timeout_seconds=plan.timeout_seconds,
                on_output=write_output,
            )
        )
        while not run.done():
            await asyncio.wait({run}, timeout=POLL_SECONDS)
            if proxy is None or run.done():
                continue
            status = await proxy.status()
            if status.aborted:
                outcome.stop_reason = f"strict divergence: {status.aborted}"
            elif status.replay_exhausted:
                outcome.stop_reason = (
                    f"replay-only: stopped at the cut point after {status.served_replayed} replayed exchanges"
                )
            if outcome.stop_reason:
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError, SidecarError):
                    await run
                await client.kill()
        if not run.cancelled():
            executed = run.result()
            outcome.exit_code = executed.exit_code
            outcome.timed_out = executed.timed_out
    if proxy is not None:
        outcome.status = await proxy.status()
    return outcome


def _apply_outcome(result: RunResult, outcome: AgentOutcome, plan: RolloutPlan) -> None:
    """Set status, error and error_category from how the agent phase ended."""
    if outcome.stop_reason and outcome.status.aborted:
        result.status, result.error_category, result.error = "error", "divergence", outcome.stop_reason
    elif outcome.stop_reason:
        result.status, result.error_category, result.error = "timeout", "replay_only", outcome.stop_reason
    elif outcome.timed_out:
        result.status, result.error_category = "timeout", "timeout"
        result.error = f"agent timed out after {plan.timeout_seconds:.0f} s"
    elif outcome.exit_code != 0:
        result.status, result.error_category = "error", "agent_error"
        result.error = f"agent exited with code {outcome.exit_code}; see agent/output.log"
    else:
        result.status = "ok"
