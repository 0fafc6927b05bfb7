"""One rollout's lifecycle: setup → start → install → provision the task's services → readiness
gate → execute → verify → cleanup (the services torn down before the sandbox stops).

`execute_rollout` drives it for a fresh recording (`reroll run`) and for a continuation
(`reroll continue`, ``replay``, ``branch``, which add a `ReplayConfig`); `reroll.rollout.start`
builds the `RolloutPlan`: the live model and the LLM proxy are started on
the host (`reroll.rollout.llm_side`), the sandbox and its sidecar next, the agent is installed
and launched with the proxy's URL and token (`reroll.rollout.agent_phase`), and the result and
the run folder are written whatever happens: how the agent phase and the verifier ended, into
result.json's status, error and error_category (the end of this module).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from reroll_contracts.errors import (
    ErrorCategory,
    RerollError,
    SandboxError,
    TrajectoryFormatError,
    error_category,
)
from reroll_contracts.trajectory import load_trajectory
from rich.console import Console

from reroll.cache import host_cpus, host_memory_mb
from reroll.host.llm_proxy import LlmProxy
from reroll.rollout.agent_phase import install_agent, intercept_agent, run_agent
from reroll.rollout.layers import capture_checkpoint, restore_checkpoint
from reroll.rollout.learner_store import harvest_learner_store, mount_learner_store
from reroll.rollout.llm_side import start_llm_side
from reroll.rollout.plan import RolloutPlan
from reroll.rollout.scenes import AgentOutcome, TrialContext, run_trial
from reroll.rollout.script_verifier import quiesce
from reroll.rollout.skills import SceneSkills
from reroll.rollout.verifiers import Verdict, VerifyRequest, verifier_for
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
from reroll.sandbox.base import (
    WITHOUT_NETWORK_POLICY,
    Sandbox,
    create_sandbox,
    trust_host_ca,
)
from reroll.sandbox.services import Environment
from reroll.tasks.compat import resolve_env
from reroll.tasks.task import Task, capped_to_host

RESTORED_FILE = "restored-checkpoint.json"
"""In ``harness/`` of a rollout forked from checkpoint layers: the checkpoint it restored (its
layers' digests, which the restore reproduced)."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH where the image sets none."""


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
    _open_run_folder(plan)
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
                proxy, interceptor = await start_llm_side(plan, sandbox, stack, harness_dir, console)
                network = f"network {plan.task.spec.environment.network}"
                if plan.config.sandbox in WITHOUT_NETWORK_POLICY:
                    network = "the host's network; cpus and memory not limited"
                console.print(f"[dim]starting {plan.config.sandbox} sandbox ({network})[/dim]")
                await sandbox.start()
            env = sandbox_env(sandbox)
            if plan.task.spec.environment.network == "full":  # e.g. pip install in the agent or test.sh
                env |= await trust_host_ca(sandbox)
            for agent in plan.agents.values():
                await install_agent(sandbox, agent, env, console)
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
                agent_env = await intercept_agent(sandbox, interceptor, proxy)
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
                    run_agent, sandbox, plan, proxy, env | task_env | agent_env, console
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
        await _record_failure(result, exc, sandbox, plan.run_dir)
    finally:
        _write_result(result, plan.run_dir, started)
    return result


def _open_run_folder(plan: RolloutPlan) -> None:
    """Write what the run folder holds before anything starts: config.json, an empty prompts.json,
    and for an agent that calls no model an empty trajectory (no proxy records one), so the run
    can be replayed and rescored."""
    write_json(plan.run_dir / CONFIG_FILE, plan.config)
    write_json(plan.run_dir / PROMPTS_FILE, [])
    if plan.agent.api_format == "none":
        (plan.run_dir / TRAJECTORY).parent.mkdir(exist_ok=True)
        (plan.run_dir / TRAJECTORY).touch()


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


def sandbox_env(sandbox: Sandbox) -> dict[str, str]:
    """The base environment of every process the controller starts in `sandbox`: the image's
    ENV (its PATH too, as the task's own harness gives it), a locale and terminal where the image
    sets none, and the layout's variables (HOME, REROLL_*)."""
    layout = sandbox.layout
    image_path = layout.image_env.get("PATH", DEFAULT_PATH)
    # Where the sandbox is a folder of the host (local), the interpreter reroll runs on comes
    # first, so `python3` works even where PATH holds shims. Not in a container (root ``/``):
    # there the host's folder (pyenv's, under /root) is one the agent's user may not search, and
    # a program looked up past it fails with EACCES instead of "not found" (OpenHands' probe
    # for tmux crashed on that).
    host_bin = f"{Path(sys.base_prefix) / 'bin'}:" if layout.root != "/" else ""
    return {
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        **layout.image_env,
        "PATH": f"{host_bin}{image_path}",
        **layout.env(),
    }


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


def _judge_replay(config: RunConfig) -> Path | None:
    """The recorded judge trajectory a re-scored run replays (``rescored_from`` without a live
    judge model); None otherwise."""
    rescored = config.rescored_from
    if rescored is None or rescored.judge_model is not None:
        return None
    return Path(rescored.path) / JUDGE_TRAJECTORY


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


def _apply_verdict(result: RunResult, verdict: Verdict) -> None:
    """The verifier's `verdict` into `result`: its rewards, or its error (`_fail`)."""
    result.timings.verifier_seconds = round(verdict.duration_seconds, 3)
    if verdict.status == "ok":
        result.rewards = verdict.rewards
        result.verify_result = verdict.result
    else:
        _fail(result, verdict.error_category or "verifier_error", verdict.error)


async def _record_failure(result: RunResult, exc: Exception, sandbox: Sandbox | None, run_dir: Path) -> None:
    """End `result` in status ``error`` for `exc`, which ended the rollout (`_fail`): an exception
    outside reroll's tree (a bug) as ``internal`` with its traceback in ``error.txt``; a sandbox
    failure after the sandbox hit a resource limit as ``resource_limit``."""
    message = str(exc)
    if not isinstance(exc, RerollError):  # a bug: keep its traceback
        (run_dir / ERROR_FILE).write_text("".join(traceback.format_exception(exc)))
        message = f"internal error: {exc!r}; traceback in {ERROR_FILE}"
    limited = isinstance(exc, SandboxError) and result.error_category != "agent_error"
    if limited and (hit := await _limits_hit_after(sandbox)):
        # e.g. the OOM killer ended the sidecar: the limit is the cause (not retried)
        result.error_category = "resource_limit"
        message = headline(f"the sandbox hit a resource limit: {'; '.join(hit)}", message)
    _fail(result, error_category(exc), message)


async def _limits_hit_after(sandbox: Sandbox | None) -> list[str]:
    """`Sandbox.limits_hit` of a sandbox that failed (and may be stopped); empty when unknown."""
    if sandbox is None:
        return []
    try:
        return await sandbox.limits_hit()
    except RerollError:
        return []


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


def _write_result(result: RunResult, run_dir: Path, started: float) -> None:
    """Complete `result` (the counts of what was recorded when the rollout ended early, the
    User's counts, the end time, `started`'s ``time.monotonic()`` to now) and write result.json."""
    trajectory = run_dir / TRAJECTORY
    if result.counts.tokens is None and trajectory.exists():  # ended early: count what was recorded
        with contextlib.suppress(TrajectoryFormatError):
            result.counts = count_exchanges(load_trajectory(trajectory))
    if (run_dir / USER_TRAJECTORY).is_file():
        with contextlib.suppress(TrajectoryFormatError):
            result.user_counts = count_exchanges(load_trajectory(run_dir / USER_TRAJECTORY))
    result.finished_at = now_iso()
    result.timings.total_seconds = round(time.monotonic() - started, 3)
    write_json(run_dir / RESULT_FILE, result)
