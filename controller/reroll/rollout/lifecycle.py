"""One rollout's lifecycle: setup → start → install → (extensions: services, restore …) →
execute → verify → cleanup, the extensions' hooks (`reroll.rollout.hooks`) called at each stage.

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
from pathlib import Path
from typing import Any

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
from reroll.rollout.agent_phase import install_agent, run_agent
from reroll.rollout.hooks import Hooks, Run
from reroll.rollout.llm_side import port_of, start_llm_side
from reroll.rollout.plan import RolloutPlan
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.rollout.turns.scenes import AgentOutcome, TrialContext, run_trial
from reroll.rollout.verify.script_verifier import keeps_agent_processes, quiesce
from reroll.rollout.verify.verifiers import Verdict, Verifier, VerifyRequest, verifier_for
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import (
    AGENT_LOG,
    ERROR_FILE,
    RunResult,
    count_exchanges,
    now_iso,
    write_json,
)
from reroll.sandbox.base import (
    WITHOUT_NETWORK_POLICY,
    Sandbox,
    create_sandbox,
    trust_host_ca,
)
from reroll.tasks.compat import resolve_env
from reroll.tasks.task import Task
from reroll.tasks.variants import capped_to_host

__all__ = ["RolloutPlan", "execute_rollout", "new_run_id", "sandbox_env"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH where the image sets none."""


def new_run_id() -> str:
    """A short random id for a rollout (8 hex digits)."""
    return uuid.uuid4().hex[:8]


async def execute_rollout(
    plan: RolloutPlan,
    console: Console,
    start_gate: asyncio.Semaphore | None = None,
    hooks: Hooks | None = None,
) -> RunResult:
    """Run one rollout end to end and write its run folder; its extensions' hooks
    (`reroll.rollout.hooks`) are called at each stage.

    config.json is written first; prompts.json and trial.json as each turn of the trial starts
    and ends (`reroll.rollout.turns.scenes`); result.json last, also when the rollout
    failed: status ``error`` with the cause and its class's ``error_category`` (`reroll_contracts.errors`);
    an exception outside reroll's tree (a bug) gets category ``internal`` and its traceback in
    ``error.txt``. Exchanges are written by the proxy as they happen.

    Args:
        plan: what runs, and the (new, empty) run folder.
        console: where progress goes.
        start_gate: held while the model server, LLM proxy and sandbox start, the agent is made
            ready (install check, verifier baseline, hooks) and launched (a job bounds how many
            rollouts start at once, so start-up timeouts are not hit when many start together;
            its first rollout reaches its agent's first request before the others' starts share
            the machine's cores with it: `reroll.jobs.executors.HeadStartGate`); None: no bound.
        hooks: the rollout's extensions, configured (`reroll.rollout.hooks.load_extensions`);
            None: none.

    Returns:
        The result as written to result.json.
    """
    hooks = hooks or Hooks()
    started = time.monotonic()
    result = RunResult(started_at=now_iso())
    _open_run_folder(plan)
    sandbox: Sandbox | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            sandbox, task_env, verifier = _new_sandbox(plan, console)
            stack.push_async_callback(sandbox.stop)
            run = Run(plan, console, stack, sandbox, result, hooks, task_env=task_env, verifier=verifier)
            async with start_gate or contextlib.nullcontext():
                trial = await _set_up(run)
                result.timings.setup_seconds = round(time.monotonic() - started, 3)
                running = asyncio.ensure_future(run_trial(trial, console))
                await _until_launched(run, running)
            outcome = await running
            await run.hooks.after_agent(run, outcome)
            result.timings.agent_seconds = round(time.monotonic() - started - result.timings.setup_seconds, 3)
            await _settle(run, outcome)
            _apply_outcome(result, outcome, plan, await sandbox.limits_hit())
            if outcome.status.stop is None or outcome.status.stop.kind == "step_limit":
                console.print("[dim]verifying[/dim]")
                verdict = await verifier.verify(trial.verify_request)
                _apply_verdict(result, verdict)
                await run.hooks.after_verify(run, verdict)
    except Exception as exc:  # every failure ends in status error, never null
        await _record_failure(result, exc, sandbox, plan.run_dir)
    finally:
        _write_result(result, plan.run_dir, started)
    return result


def _new_sandbox(plan: RolloutPlan, console: Console) -> tuple[Sandbox, dict[str, str], Verifier]:
    """The rollout's sandbox, created (not started), the task's environment (``environment.env``)
    and its verifier; the task's ignored fields on the console.

    Raises:
        TaskError: ``environment.env`` names a variable the host lacks, or the verifier is unknown.
        SandboxBackendError: the sandbox cannot be created.
    """
    task_env = resolve_env(plan.task.spec.environment.env, os.environ, "environment.env")
    if plan.task.ignored:
        fields = ", ".join(note.field for note in plan.task.ignored)
        console.print(f"[yellow]task {plan.task.name} ignores {fields} (reroll task check says why)[/yellow]")
    verifier = verifier_for(plan.task)
    sandbox = create_sandbox(
        plan.config.sandbox,
        sandbox_spec(_fit_to_host(plan, console)),
        plan.run_dir.name,
        plan.sandbox_settings,
    )
    return sandbox, task_env, verifier


async def _until_launched(run: Run, running: asyncio.Future[AgentOutcome]) -> None:
    """Wait until the trial `running` launched its first agent (`Run.launched`) or ended; when
    this wait is cancelled, the trial is cancelled too."""
    launched = asyncio.ensure_future(run.launched.wait())
    either: list[asyncio.Future[Any]] = [launched, running]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        running.cancel()
        raise
    finally:
        launched.cancel()


async def _set_up(run: Run) -> TrialContext:
    """Start the LLM side and the sandbox, install the agents, prepare the verifier; the
    extensions' hooks before the sandbox starts, after it started and before the agent.

    Returns:
        What the turn scheduler runs (also ``run.trial``).
    """
    plan, sandbox, console = run.plan, run.sandbox, run.console
    networks = plan.task.spec.networks()
    denied = (*networks.agent_denied, *networks.agent_blocked_urls)
    policy = f"full less {', '.join(denied)}" if denied else networks.agent
    network = f"network {policy}" + (
        f", the verifier's {networks.verifier}" if networks.verifier != policy else ""
    )
    if plan.config.sandbox in WITHOUT_NETWORK_POLICY:
        network = "the host's network; cpus and memory not limited"
    console.print(f"[dim]starting {plan.config.sandbox} sandbox ({network})[/dim]")
    await _start_together(run)
    run.env = sandbox_env(sandbox)
    if plan.task.spec.environment.network == "full":  # e.g. pip install in the agent or test.sh
        run.env |= await trust_host_ca(sandbox)
    for agent in plan.agents.values():
        await install_agent(sandbox, agent, run.env, console)
    await run.hooks.after_sandbox_start(run)
    assert run.verifier is not None
    await run.verifier.prepare(sandbox, run.env)
    env = run.env | run.task_env
    run.trial = TrialContext(
        trial=plan.trial,
        agents=plan.agents,
        task=plan.task,
        sandbox=sandbox,
        env=env,
        run_dir=plan.run_dir,
        proxy=run.proxy,
        run_turn=functools.partial(run_agent, run),
        verifier=run.verifier,
        verify_request=VerifyRequest(
            sandbox,
            env,
            plan.run_dir,
            plan.paths.verifier.root,
            keep_agent_processes=keeps_agent_processes(plan.task, plan.agent, sandbox.layout.agent_user),
            sandbox_settings=plan.settings.sandbox_config,
        ),
        recorded=plan.recorded,
    )
    await run.hooks.before_agent(run)
    return run.trial


async def _start_together(run: Run) -> None:
    """Start the LLM side (`start_llm_side`, then the ``before_sandbox_start`` hooks) and the
    sandbox at once: neither waits for the other's processes (model server, proxy; namespaces,
    sidecar). The sandbox's network is made first (`Sandbox.host_address`), and the proxy's port
    opened again once the sandbox runs (`Sandbox.allow_host_port` is idempotent), whichever
    finished first. Both are waited for; the LLM side's error is raised first.

    Raises:
        As `start_llm_side`, the extensions' hooks and `Sandbox.start`.
    """
    plan, sandbox = run.plan, run.sandbox
    await sandbox.host_address()  # made once, before the two starts use it (docker: the network)

    async def llm_side() -> None:
        run.proxy = await start_llm_side(plan, sandbox, run.stack, plan.paths.make_harness())
        await run.hooks.before_sandbox_start(run)

    outcomes = await asyncio.gather(llm_side(), sandbox.start(), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    if run.proxy is not None:
        await sandbox.allow_host_port(port_of(run.proxy.base_url))


async def _settle(run: Run, outcome: AgentOutcome) -> None:
    """After the trial: stop the proxy (no response the agent never received gets recorded
    later) and count what it recorded, end every process of the agent (the workspace is final;
    but where the verify keeps them, `keeps_agent_processes`), write its manifest; the
    extensions' hooks before the verify."""
    plan, sandbox = run.plan, run.sandbox
    if run.proxy is not None:
        await run.proxy.stop()
        run.result.counts = count_exchanges(load_trajectory(plan.paths.trajectory))
    if not keeps_agent_processes(plan.task, plan.agent, sandbox.layout.agent_user):
        await quiesce(sandbox)  # no process of the agent outlives it: the workspace is final
    write_json(plan.paths.manifest, await sandbox.manifest(sandbox.layout.workspace))
    await run.hooks.before_verify(run, outcome)


def _open_run_folder(plan: RolloutPlan) -> None:
    """Write what the run folder holds before anything starts: config.json, an empty prompts.json,
    and for an agent that calls no model an empty trajectory (no proxy records one), so the run
    can be replayed and rescored."""
    write_json(plan.paths.config, plan.config)
    write_json(plan.paths.prompts, [])
    if plan.agent.api_format == "none":
        plan.paths.trajectory.parent.mkdir(exist_ok=True)
        plan.paths.trajectory.touch()


def _fit_to_host(plan: RolloutPlan, console: Console) -> Task:
    """The task the sandbox gets: `plan.task` with its cpus and memory capped to the host's
    (`capped_to_host`), each cap on the console and in the run folder's `LIMITS_FILE`; as it is
    on a backend that enforces no limits."""
    task, notes = fitted_to_host(plan.task, plan.config.sandbox)
    if notes:
        RunPaths(plan.run_dir).limits.write_text("".join(f"{note}\n" for note in notes))
        for note in notes:
            console.print(f"[yellow]{note}[/yellow]")
    return task


def fitted_to_host(task: Task, backend: str) -> tuple[Task, list[str]]:
    """`task` as a sandbox of `backend` gets it, and a note per limit lowered: its cpus and memory
    capped to the host's (`capped_to_host`), unchanged on a backend that enforces no limits."""
    if backend in WITHOUT_NETWORK_POLICY:
        return task, []
    return capped_to_host(task, host_cpus(), host_memory_mb())


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


def _apply_outcome(
    result: RunResult, outcome: AgentOutcome, plan: RolloutPlan, limits_hit: list[str]
) -> None:
    """Set status, error and error_category from how the agent phase ended; a resource limit the
    sandbox hit (`Sandbox.limits_hit`) ends it as ``resource_limit``, whatever the agent did then."""
    stop = outcome.status.stop
    if stop is not None and stop.kind == "replay_diverged":
        result.status, result.error_category = "error", "divergence"
        result.error = f"strict divergence: {stop.reason}"
    elif stop is not None and stop.kind == "step_limit":
        result.status, result.error_category = "timeout", "step_limit"
        result.error = f"cut at the step limit: {stop.step} steps served (--max-steps)"
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
        RunPaths(run_dir).error.write_text("".join(traceback.format_exception(exc)))
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
    and an agent's failure or a resource limit the agent phase hit stays the headline (`headline`:
    a disk the agent filled also fails the verifier's writes)."""
    agent_failure = result.error if result.error_category in ("agent_error", "resource_limit") else None
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
    paths = RunPaths(run_dir)
    trajectory = paths.trajectory
    if result.counts.tokens is None and trajectory.exists():  # ended early: count what was recorded
        with contextlib.suppress(TrajectoryFormatError):
            result.counts = count_exchanges(load_trajectory(trajectory))
    if paths.user_trajectory.is_file():
        with contextlib.suppress(TrajectoryFormatError):
            result.user_counts = count_exchanges(load_trajectory(paths.user_trajectory))
    result.finished_at = now_iso()
    result.timings.total_seconds = round(time.monotonic() - started, 3)
    write_json(paths.result, result)
