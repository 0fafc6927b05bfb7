"""One rollout's lifecycle: setup → start → install → provision the task's services → readiness
gate → execute → verify → cleanup (the services torn down before the sandbox stops).

`execute_rollout` drives it for a fresh recording (`reroll run`) and for a continuation
(`reroll continue`, ``replay``, ``branch``, which add a `ReplayConfig`); `reroll.rollout.start`
builds the `RolloutPlan`: the live model and the LLM proxy are started on
the host, the sandbox and its sidecar next, the agent is installed and launched with the proxy's
URL and token, and the result and the run folder are written whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import time
import traceback
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from reroll_contracts.errors import (
    AgentInstallError,
    ErrorCategory,
    RerollError,
    SandboxError,
    SidecarError,
    TrajectoryFormatError,
    error_category,
)
from reroll_contracts.proxy import ReplayConfig, VolatileRule
from reroll_contracts.trajectory import load_trajectory
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.cache import host_cpus, host_memory_mb
from reroll.host import intercept
from reroll.host.llm_proxy import LlmProxy
from reroll.models.spec import ModelSpec, live_upstream, model_name, parse_model
from reroll.rollout.asks import Answerer, offer_ask_user
from reroll.rollout.layers import capture_checkpoint, restore_checkpoint
from reroll.rollout.learner_store import harvest_learner_store, mount_learner_store
from reroll.rollout.mcp import MCP_CONFIG_ENV, describe, mcp_servers_for, render_mcp_config
from reroll.rollout.persona import PersonaPlan
from reroll.rollout.scenes import AgentOutcome, TrialContext, run_trial
from reroll.rollout.script_verifier import quiesce
from reroll.rollout.skills import SceneSkills, SkillSelection
from reroll.rollout.verifiers import Verdict, VerifyRequest, verifier_for
from reroll.runfolder.agent_log import AgentLog
from reroll.runfolder.run import (
    AGENT_LOG,
    CONFIG_FILE,
    ERROR_FILE,
    JUDGE_TRAJECTORY,
    LIMITS_FILE,
    MANIFEST_FILE,
    PROMPTS_FILE,
    RESULT_FILE,
    TRAJECTORY,
    USER_TRAJECTORY,
    VERIFIER_DIR,
    RunConfig,
    RunResult,
    count_exchanges,
    harness_folder,
    now_iso,
    write_json,
)
from reroll.runfolder.trial import TurnRecord
from reroll.sandbox.base import (
    WITHOUT_NETWORK_POLICY,
    Sandbox,
    SandboxLayout,
    create_sandbox,
    trust_host_ca,
)
from reroll.sandbox.installs import ensure_installed, provide_runtime
from reroll.sandbox.results import ExecResult
from reroll.sandbox.services import Environment
from reroll.tasks.compat import resolve_env
from reroll.tasks.environment import McpServerSpec
from reroll.tasks.task import Task, capped_to_host
from reroll.trials.config import TrialConfig

INSTALL_TIMEOUT_SECONDS = 900.0
RESTORED_FILE = "restored-checkpoint.json"
"""In ``harness/`` of a rollout forked from checkpoint layers: the checkpoint it restored (its
layers' digests, which the restore reproduced)."""
INTERCEPT_CA_PATH = "/etc/reroll/intercept-ca.pem"
"""Where the CA bundle of an intercepted agent goes (under the sandbox root)."""


@dataclass(frozen=True)
class RolloutPlan:
    """Everything one rollout needs (built by `reroll.rollout.start.start_rollout`).

    `config` says what runs — model, agent timeout, sandbox backend, network, faults,
    provenance — and is written to config.json as it is; the other fields are what the
    controller loaded for it. The properties below read `config`, so nothing is said twice.
    """

    task: Task
    """The task, with ``config.network`` applied."""
    agents: dict[str, AgentSpec]
    """The agents of ``trial``'s roles, by name (the first role's first)."""
    trial: TrialConfig
    """The scenes, roles and turns, resolved (`reroll.trials.config`); a plain run is `TrialConfig.single`."""
    run_dir: Path
    config: RunConfig
    replay: ReplayConfig | None = None
    """What the proxy replays before it goes live; None for a fresh recording."""
    recorded_values: tuple[VolatileRule, ...] = ()
    """When it replays: the recorded rollout's sandbox values (workspace, HOME...:
    `reroll.host.llm_proxy.recorded_sandbox_values`), volatile next to the new sandbox's own."""
    recorded: list[TurnRecord] = field(default_factory=list)
    """For a continuation: the original's turns up to the cut, whose prompts are sent again as
    recorded (`reroll.rollout.scenes`)."""
    skills: SkillSelection = field(default_factory=lambda: SkillSelection("no-skill", "none", None, []))
    """What ``config.skill_mode`` mounts (`reroll.rollout.skills`)."""
    asks: Answerer | None = None
    """Answers the agent's ask_user questions when the rollout offers the tool (``config.ask_user``,
    `reroll.rollout.asks`); None: it does not."""
    persona: PersonaPlan = field(default_factory=PersonaPlan)
    """How a persona scene opens its model (`reroll.rollout.persona`)."""
    restore_from: Path | None = None
    """Restore the layers of the checkpoint in this folder before the agent starts (a branch
    forked by snapshot); its step must be `restore_step`."""
    restore_step: int = 0
    """The step of the checkpoint restored: the cut index K."""
    checkpoint_every: int = 0
    """Capture a checkpoint (`reroll.rollout.layers`) every this many steps while the agent runs
    live, into ``checkpoints/step-K/`` of the run folder (``reroll run --checkpoint-every``), and
    at the cut of a replay-only rollout when it is such a step (a branch's rebuilt prefix); 0: none."""

    @property
    def agent(self) -> AgentSpec:
        """The first role's agent: its API format and proxy mode are the rollout's."""
        return next(iter(self.agents.values()))

    @property
    def timeout_seconds(self) -> float:
        """The agent's wall-clock budget in seconds: ``config.timeout_sec``, else the task's."""
        return self.config.timeout_sec or self.task.spec.agent.timeout_sec

    @property
    def live_model(self) -> ModelSpec | None:
        """``config.model`` parsed: the live upstream; None for an agent that calls no model and
        for a replay-only continuation.

        Raises:
            ModelError: the model cannot be resolved (see `reroll.models.spec.parse_model`).
        """
        provenance = self.config.continued_from
        if self.agent.api_format == "none" or self.config.model is None:
            return None
        if provenance is not None and provenance.replay_only:
            return None
        return parse_model(self.config.model, self.task.path, self.agent.name)

    @property
    def agent_model(self) -> str:
        """The model name the agent asks for: a continuation keeps the original's (the proxy
        sends the live model's name upstream); "" for an agent that calls none."""
        provenance = self.config.continued_from or self.config.branched_from
        spec = provenance.original_model if provenance is not None else self.config.model
        return model_name(spec) if spec else ""


def new_run_id() -> str:
    """A short random id for a rollout (8 hex digits)."""
    return uuid.uuid4().hex[:8]


async def execute_rollout(
    plan: RolloutPlan, console: Console, start_gate: asyncio.Semaphore | None = None
) -> RunResult:
    """Run one rollout end to end and write its run folder.

    config.json is written first; prompts.json and trial.json as each turn of the trial starts
    and ends (`reroll.rollout.scenes`); result.json last, also when the rollout
    failed: status ``error`` with the cause and its class's ``error_category`` (`reroll_contracts.errors`);
    an exception outside reroll's tree (a bug) gets category ``internal`` and its traceback in
    ``error.txt``. Exchanges are written by the proxy as they happen.

    Args:
        plan: what runs, and the (new, empty) run folder.
        console: where progress goes.
        start_gate: held while the model server, LLM proxy and sandbox start (a job bounds how
            many rollouts start at once, so start-up timeouts are not hit when many start
            together); None: no bound.

    Returns:
        The result as written to result.json.
    """
    started = time.monotonic()
    result = RunResult(started_at=now_iso())
    write_json(plan.run_dir / CONFIG_FILE, plan.config)
    write_json(plan.run_dir / PROMPTS_FILE, [])
    if plan.agent.api_format == "none":  # no proxy records one: an empty trajectory, so the run
        (plan.run_dir / TRAJECTORY).parent.mkdir(exist_ok=True)  # can be replayed and rescored
        (plan.run_dir / TRAJECTORY).touch()
    harness_dir = harness_folder(plan.run_dir)
    sandbox: Sandbox | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            task_env = resolve_env(plan.task.spec.environment.env, os.environ, "environment.env")
            if plan.task.ignored:
                fields = ", ".join(note.field for note in plan.task.ignored)
                console.print(
                    f"[yellow]task {plan.task.name} ignores {fields} (reroll task check says why)[/yellow]"
                )
            verifier = verifier_for(plan.task)
            sandbox = create_sandbox(
                plan.config.sandbox,
                _fit_to_host(plan, console),
                plan.run_dir.name,
                plan.config.sandbox_config,
            )
            stack.push_async_callback(sandbox.stop)
            async with start_gate or contextlib.nullcontext():
                proxy, interceptor = await _start_llm_side(plan, sandbox, stack, harness_dir, console)
                network = f"network {plan.task.spec.environment.network}"
                if plan.config.sandbox in WITHOUT_NETWORK_POLICY:
                    network = "the host's network; cpus and memory not limited"
                console.print(f"[dim]starting {plan.config.sandbox} sandbox ({network})[/dim]")
                await sandbox.start()
            env = sandbox_env(sandbox)
            if plan.task.spec.environment.network == "full":  # e.g. pip install in the agent or test.sh
                env |= await trust_host_ca(sandbox)
            for agent in plan.agents.values():
                await _install_agent(sandbox, agent, env, console)
            if (store := plan.config.learner_store) is not None:
                console.print(f"[dim]learner store: generation {store.generation}[/dim]")
                env |= await mount_learner_store(sandbox, store, env)
            environment = Environment(sandbox, plan.task, plan.run_dir, env | task_env)
            stack.push_async_callback(environment.teardown)  # before the sandbox stops
            await _provision(environment, console)
            task_env |= environment.exec_env()
            await verifier.prepare(sandbox, env)
            if plan.restore_from is not None:
                console.print(f"[dim]restoring the checkpoint layers of step {plan.restore_step}[/dim]")
                restored = await restore_checkpoint(
                    sandbox, plan.task, plan.agent, plan.restore_from, env | task_env, step=plan.restore_step
                )
                write_json(harness_dir / RESTORED_FILE, restored)
            agent_env: dict[str, str] = {}
            if interceptor is not None and proxy is not None:
                agent_env = await _intercept_agent(sandbox, interceptor, proxy)
            result.timings.setup_seconds = round(time.monotonic() - started, 3)
            skills = SceneSkills(sandbox, env, plan.agents, plan.skills, plan.config.skill_nudge, console)
            request = VerifyRequest(
                sandbox,
                env | task_env,
                plan.run_dir,
                plan.run_dir / VERIFIER_DIR,
                judge_model=plan.config.judge_model,
                judge_replay=_judge_replay(plan.config),
            )
            trial = TrialContext(
                trial=plan.trial,
                agents=plan.agents,
                task=plan.task,
                sandbox=sandbox,
                env=env | task_env,
                run_dir=plan.run_dir,
                proxy=proxy,
                run_turn=functools.partial(
                    _run_agent, sandbox, plan, proxy, env | task_env | agent_env, console
                ),
                verifier=verifier,
                verify_request=request,
                recorded=plan.recorded,
                hook=skills,
                asks=plan.asks,
                persona=plan.persona,
            )
            async with _checkpoints_while(plan, proxy, sandbox, env | task_env, console):
                outcome = await run_trial(trial, console)
            result.timings.agent_seconds = round(time.monotonic() - started - result.timings.setup_seconds, 3)
            if proxy is not None:
                # Stopped now, so no response the agent never received gets recorded later.
                await proxy.stop()
                result.counts = count_exchanges(load_trajectory(plan.run_dir / TRAJECTORY))
            if outcome.status.stop is None:  # a stopped replay killed every process, services too
                await environment.check_alive()
            if plan.skills.mode != "no-skill":
                exchanges = load_trajectory(plan.run_dir / TRAJECTORY).exchanges if proxy else []
                result.skills_opened, result.skills_generated = skills.opened(exchanges), skills.generated
            await quiesce(sandbox)  # no process of the agent outlives it: the workspace is final
            manifest = await sandbox.manifest(sandbox.layout.workspace)
            write_json(plan.run_dir / MANIFEST_FILE, manifest)
            if store is not None and store.writes_back:
                result.learner_store = await harvest_learner_store(sandbox, Path(store.path))
            _apply_outcome(result, outcome, plan, await sandbox.limits_hit())
            if outcome.status.stop is None:
                console.print("[dim]verifying[/dim]")
                _apply_verdict(result, await verifier.verify(request))
                if (plan.run_dir / JUDGE_TRAJECTORY).is_file():
                    result.judge_counts = count_exchanges(load_trajectory(plan.run_dir / JUDGE_TRAJECTORY))
    except Exception as exc:  # every failure ends in status error, never null
        message = str(exc)
        if not isinstance(exc, RerollError):  # a bug: keep its traceback
            (plan.run_dir / ERROR_FILE).write_text("".join(traceback.format_exception(exc)))
            message = f"internal error: {exc!r}; traceback in {ERROR_FILE}"
        limited = isinstance(exc, SandboxError) and result.error_category != "agent_error"
        if limited and (hit := await _limits_hit_after(sandbox)):
            # e.g. the OOM killer ended the sidecar: the limit is the cause (not retried)
            result.error_category = "resource_limit"
            message = headline(f"the sandbox hit a resource limit: {'; '.join(hit)}", message)
        _fail(result, error_category(exc), message)
    finally:
        trajectory = plan.run_dir / TRAJECTORY
        if result.counts.tokens is None and trajectory.exists():  # ended early: count what was recorded
            with contextlib.suppress(TrajectoryFormatError):
                result.counts = count_exchanges(load_trajectory(trajectory))
        if (plan.run_dir / USER_TRAJECTORY).is_file():
            with contextlib.suppress(TrajectoryFormatError):
                result.user_counts = count_exchanges(load_trajectory(plan.run_dir / USER_TRAJECTORY))
        result.finished_at = now_iso()
        result.timings.total_seconds = round(time.monotonic() - started, 3)
        write_json(plan.run_dir / RESULT_FILE, result)
    return result


CHECKPOINTS_DIR = "checkpoints"
"""In a run folder: the checkpoints captured while it ran (``--checkpoint-every``), ``step-K/`` each."""


@contextlib.asynccontextmanager
async def _checkpoints_while(
    plan: RolloutPlan, proxy: LlmProxy | None, sandbox: Sandbox, env: dict[str, str], console: Console
) -> AsyncIterator[None]:
    """While the block runs the agent: each time the proxy holds a request at a step boundary
    (`RolloutPlan.checkpoint_every`), capture the layers into ``checkpoints/step-K/`` and let the
    request go on. The agent waits for its model meanwhile: its conversation is quiescent (a
    process it left running in the background is not frozen). A failed capture is reported, the
    run goes on (a branch refuses the incomplete checkpoint and rebuilds the prefix)."""
    if proxy is None or not plan.checkpoint_every:
        yield
        return

    async def capture() -> None:
        while True:
            step = await proxy.wait_for_held()
            folder = plan.run_dir / CHECKPOINTS_DIR / f"step-{step}"
            try:
                await capture_checkpoint(
                    sandbox, plan.task, plan.agent, step, folder, env, quiesce_agent=False
                )
                console.print(f"[dim]checkpoint of step {step}: {folder}[/dim]")
            except RerollError as exc:
                console.print(f"[yellow]checkpoint of step {step} failed: {exc}[/yellow]")
            finally:
                await proxy.release(step)

    capturing = asyncio.create_task(capture())
    try:
        yield
    finally:
        capturing.cancel()
        with contextlib.suppress(asyncio.CancelledError, RerollError):
            await capturing


async def _provision(environment: Environment, console: Console) -> None:
    """Start the task's services and hold the rollout until all are ready (the readiness gate:
    `reroll.sandbox.services`); nothing to do for a task without any."""
    if not environment.declared:
        return
    names = ", ".join(service.name for service in environment.spec.services) or "the image's own"
    timeout = environment.spec.readiness.timeout_sec
    console.print(f"[dim]starting services ({names}); the agent waits until ready (≤ {timeout:g} s)[/dim]")
    gate = time.monotonic()
    await environment.provision()
    await environment.wait_ready()
    console.print(f"[dim]services ready after {time.monotonic() - gate:.1f} s[/dim]")


def _fit_to_host(plan: RolloutPlan, console: Console) -> Task:
    """The task the sandbox gets: `plan.task` with its cpus and memory capped to the host's
    (`capped_to_host`), each cap on the console and in the run folder's `LIMITS_FILE`; as it is
    on a backend that enforces no limits."""
    if plan.config.sandbox in WITHOUT_NETWORK_POLICY:
        return plan.task
    task, notes = capped_to_host(plan.task, host_cpus(), host_memory_mb())
    if notes:
        (plan.run_dir / LIMITS_FILE).write_text("".join(f"{note}\n" for note in notes))
        for note in notes:
            console.print(f"[yellow]{note}[/yellow]")
    return task


async def _limits_hit_after(sandbox: Sandbox | None) -> list[str]:
    """`Sandbox.limits_hit` of a sandbox that failed (and may be stopped); empty when unknown."""
    if sandbox is None:
        return []
    try:
        return await sandbox.limits_hit()
    except RerollError:
        return []


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
    if (live_model := plan.live_model) is not None:
        upstream = await stack.enter_async_context(live_upstream(live_model, harness_dir))
    host = await sandbox.host_address()
    proxy = LlmProxy(
        workdir=harness_dir,
        trajectory_path=plan.run_dir / TRAJECTORY,
        upstream=upstream,
        replay=plan.replay,
        listen_host=host,
        faults=plan.config.faults,
        volatile=volatile_rules(plan, sandbox.layout),
        hold_every=plan.checkpoint_every,
    )
    await stack.enter_async_context(proxy)
    await sandbox.allow_host_port(_port(proxy.base_url))
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
    await sandbox.allow_host_port(_port(interceptor.proxy_url))
    return proxy, interceptor


def _port(url: str) -> int:
    """The port of an ``http://HOST:PORT…`` URL of a listener reroll started."""
    port = urllib.parse.urlsplit(url).port
    assert port is not None, url
    return port


def volatile_rules(plan: RolloutPlan, layout: SandboxLayout) -> list[VolatileRule]:
    """What may differ between the recording and this rollout's requests (`reroll_proxy.volatile`).

    Args:
        plan: the rollout (its agents' declared rules, and the recorded sandbox's values when it replays).
        layout: this rollout's sandbox paths.

    Returns:
        One ``value`` rule per sandbox path (workspace, HOME, agents folder, sandbox root when it
        is not ``/``: written to ``harness/proxy.json``, where a later replay finds them), the
        recorded rollout's, then the agent's ``volatile`` declarations.
    """
    paths = {
        "workspace": layout.workspace,
        "home": layout.home,
        "agents": layout.agents_dir,
        "sandbox": layout.root if layout.root != "/" else "",
    }
    rules = [VolatileRule(value=path, label=label) for label, path in paths.items() if path]
    recorded = plan.recorded_values
    declared = [rule for agent in plan.agents.values() for rule in agent.volatile]
    return [*rules, *(rule for rule in recorded if rule not in rules), *declared]


def sandbox_env(sandbox: Sandbox) -> dict[str, str]:
    """The base environment of every process the controller starts in `sandbox` (PATH, locale, layout)."""
    layout = sandbox.layout
    # Where the sandbox is a folder of the host (local), the interpreter reroll runs on comes
    # first, so `python3` works even where PATH holds shims. Not in a container (root ``/``):
    # there the host's folder (pyenv's, under /root) is one the agent's user may not search, and
    # a program looked up past it fails with EACCES instead of "not found" (OpenHands' probe
    # for tmux crashed on that).
    host_bin = f"{Path(sys.base_prefix) / 'bin'}:" if layout.root != "/" else ""
    return {
        "PATH": f"{host_bin}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        **layout.env(),
    }


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


async def _intercept_agent(
    sandbox: Sandbox, interceptor: intercept.Interceptor, proxy: LlmProxy
) -> dict[str, str]:
    """Put the CA bundle into `sandbox`; the environment that sends the agent through `interceptor`."""
    ca_path = sandbox.layout.path(INTERCEPT_CA_PATH)
    await sandbox.put_file(ca_path, intercept.ca_bundle())
    proxy_host = urllib.parse.urlsplit(proxy.base_url).hostname or ""
    return intercept.sandbox_env(interceptor.proxy_url, ca_path, no_proxy=[proxy_host])


async def _install_agent(sandbox: Sandbox, agent: AgentSpec, env: dict[str, str], console: Console) -> None:
    """Install `agent` once per install key in a step of its own, and check the install before
    this rollout uses it (`reroll.sandbox.installs`: the rollout's sandbox sees it read-only)."""
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


async def _run_agent(
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
    (`reroll.rollout.scenes.TurnRunner`)."""
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


def _judge_replay(config: RunConfig) -> Path | None:
    """The recorded judge trajectory a re-scored run replays (``rescored_from`` without a live
    judge model); None otherwise."""
    rescored = config.rescored_from
    if rescored is None or rescored.judge_model is not None:
        return None
    return Path(rescored.path) / JUDGE_TRAJECTORY


def _apply_verdict(result: RunResult, verdict: Verdict) -> None:
    """The verifier's `verdict` into `result`: its rewards, or its error (`_fail`)."""
    result.timings.verifier_seconds = round(verdict.duration_seconds, 3)
    if verdict.status == "ok":
        result.rewards = verdict.rewards
        result.verify_result = verdict.result
    else:
        _fail(result, verdict.error_category or "verifier_error", verdict.error)


def _fail(result: RunResult, category: ErrorCategory, message: str) -> None:
    """End `result` in status ``error`` with `message`: the category of an earlier failure stays,
    and an agent's failure stays the headline (`headline`)."""
    agent_failure = result.error if result.error_category == "agent_error" else None
    result.status = "error"
    result.error_category = result.error_category or category
    result.error = message if agent_failure is None else headline(agent_failure, message)


def headline(agent_failure: str, later_error: str) -> str:
    """The error of a rollout whose agent failed before a later step (verification) failed too:
    the agent's failure first, the later error's first line after it."""
    first_line = later_error.strip().split("\n", 1)[0]
    return f"{agent_failure}; then: {first_line}"


def _apply_outcome(
    result: RunResult, outcome: AgentOutcome, plan: RolloutPlan, limits_hit: list[str]
) -> None:
    """Set status, error and error_category from how the agent phase ended; a resource limit the
    sandbox hit (`Sandbox.limits_hit`) ends it as ``resource_limit``, whatever the agent did then."""
    stop = outcome.status.stop
    if stop is not None and stop.kind == "replay_diverged":
        result.status, result.error_category = "error", "divergence"
        result.error = f"strict divergence: {stop.reason}"
    elif stop is not None:
        result.status, result.error_category = "timeout", "replay_only"
        result.error = (
            f"replay-only: stopped at the cut point after {outcome.status.served_replayed} replayed exchanges"
        )
    elif limits_hit:
        result.status, result.error_category = "error", "resource_limit"
        ended = "timed out" if outcome.timed_out else f"exited with code {outcome.exit_code}"
        result.error = f"the sandbox hit a resource limit: {'; '.join(limits_hit)}; the agent {ended}"
    elif outcome.timed_out:
        result.status, result.error_category = "timeout", "timeout"
        result.error = f"agent timed out after {plan.timeout_seconds:.0f} s"
    elif outcome.exit_code != 0:
        result.status, result.error_category = "error", "agent_error"
        tail = f": {outcome.output_tail}" if outcome.output_tail else ""
        result.error = f"agent exited with code {outcome.exit_code}{tail} (see {AGENT_LOG})"
    else:
        result.status = "ok"
