"""Jobs: many rollouts (tasks x agents x models x repeats) at bounded concurrency.

``reroll job`` / `run_job` runs a `JobSpec` into ``<jobs-dir>/<job>/``::

    <job>/
      job.json                      the resolved JobSpec (``reroll job --resume <job>`` reads it)
      <task>__<agent>__<model>__r<k>/   one run folder per rollout (names are deterministic)
      _attempts/                    folders of failed attempts that were retried, or cut short
      summary.json                  JobSummary (see reroll.jobreport), rewritten at the end
      continued/                    ``reroll continue <job> --all``: one continuation per timed-out run

Retries: a rollout that ends with ``error_category: infrastructure`` (its proxy, model server or
sandbox did not start or died: `reroll.errors.InfrastructureError`) runs again, up to
``max_retries`` more times, after ``retry_backoff_seconds * 2 ** (k - 1)`` seconds; an agent
timeout or an agent error is an outcome, never retried. The failed attempt's folder is moved to
``_attempts/``, so the rollout's name always holds its last attempt.

Executors (`reroll.executors`): each attempt runs on the job's executor — ``asyncio`` (this
process, the default) or ``ray`` (one Ray task per attempt). Retries, backoff, resume, the
progress bar and the summary are this module's, the same for every executor; an attempt the
executor lost (a Ray worker died) is retried like an infrastructure failure.

Resume: running a job into an existing job folder skips every rollout whose folder holds a
complete result.json (status and ``finished_at`` set); a folder without one (the job was
interrupted there) is moved to ``_attempts/`` and the rollout runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from reroll.agents import get_agent
from reroll.errors import InfrastructureError, JobError, RerollError
from reroll.executors import Attempt, Executor, ExecutorOptions, create_executor
from reroll.jobfile import DEFAULT_MAX_STARTING, JOB_SPEC_FILE, JobSpec
from reroll.jobreport import (
    SUMMARY_FILE,
    JobSummary,
    RolloutSummary,
    is_complete,
    print_summary,
    read_result,
    summarise_rollout,
    totals,
)
from reroll.llm_proxy import DivergencePolicy
from reroll.models import parse_model
from reroll.resume import continue_run, run_task
from reroll.runfolder import RunConfig, now_iso, write_json
from reroll.sandbox.base import BACKENDS, WITHOUT_NETWORK_POLICY
from reroll.tasks import load_task

ATTEMPTS_DIR = "_attempts"
CONTINUED_DIR = "continued"


@dataclass(frozen=True)
class PlannedRollout:
    """One rollout of a job: what runs, and the folder it runs into."""

    name: str
    """The run folder's name, ``<task>__<agent>__<model>__r<k>``."""
    task_path: Path
    task: str
    agent: str
    model: str | None
    """None for an agent that calls no model."""
    repeat: int
    """1-based repeat index."""


def plan_rollouts(spec: JobSpec) -> list[PlannedRollout]:
    """Expand `spec` into its rollouts, checking every task, agent and model first.

    An agent that calls no model runs once per (task, repeat), whatever `spec.models` holds.

    Raises:
        TaskError, AgentError, ModelError: a task folder, agent name or model spec is invalid.
        JobError: an agent calls a model but `spec.models` is empty, the sandbox backend is
            unknown, or network ``none`` is asked of the local backend.
    """
    if spec.sandbox not in BACKENDS:
        raise JobError(f"unknown sandbox backend {spec.sandbox!r}; known: {', '.join(sorted(BACKENDS))}")
    if spec.network == "none" and spec.sandbox in WITHOUT_NETWORK_POLICY:
        raise JobError("network none needs sandbox docker: the local sandbox has the host's network")
    tasks = [load_task(path) for path in spec.tasks]
    agents = [get_agent(name) for name in spec.agents]
    planned = []
    for task in tasks:
        for spec_model in spec.models:
            parse_model(spec_model, task.path)
        for agent in agents:
            models: list[str | None] = [None] if agent.api_format == "none" else list(spec.models)
            if not models:
                raise JobError(f"agent {agent.name!r} calls a model: give the job models (--model)")
            for model in models:
                for repeat in range(1, spec.repeats + 1):
                    name = f"{task.name}__{agent.name}__{_slug(model)}__r{repeat}"
                    planned.append(PlannedRollout(name, task.path, task.name, agent.name, model, repeat))
    return planned


def _slug(model: str | None) -> str:
    """A folder-name-safe form of a model spec; a hash keeps altered specs apart."""
    if model is None:
        return "no-model"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model)[:40]
    if slug != model:
        slug += "-" + hashlib.sha256(model.encode()).hexdigest()[:6]
    return slug


async def run_job(spec: JobSpec, *, jobs_dir: Path, console: Console) -> JobSummary:
    """Run (or resume) the job `spec` into ``jobs_dir/<name>``; see the module docstring.

    Shows a progress bar and, at the end, the summary table on `console`; writes job.json
    first and summary.json last.

    Returns:
        The summary, as written to summary.json.

    Raises:
        TaskError, AgentError, ModelError, JobError: bad input (an unknown executor, or one
            whose package is missing, included), before anything runs.
        InfrastructureError: the executor could not start (e.g. Ray).
    """
    planned = plan_rollouts(spec)
    executor = create_executor(
        spec.executor,
        ExecutorOptions(spec.concurrency, spec.max_starting, spec.ray_address),
    )
    name = spec.name or datetime.now(UTC).strftime("%Y-%m-%d__%H-%M-%S")
    jobs_dir = jobs_dir.resolve()  # attempts may run in other processes (Ray workers)
    job_dir = jobs_dir / name
    saved = spec.model_copy(update={"name": name})
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json(job_dir / JOB_SPEC_FILE, saved.model_dump(mode="json"))

    async def one(rollout: PlannedRollout) -> RolloutSummary:
        folder = job_dir / rollout.name
        if is_complete(folder):
            return summarise_rollout(
                folder, task=rollout.task, agent=rollout.agent, model=rollout.model, attempts=0
            )
        if folder.exists():
            _set_aside(folder, job_dir, "interrupted")
        attempt = Attempt(
            folder,
            partial(
                run_task,
                rollout.task_path,
                agent_name=rollout.agent,
                model=rollout.model,
                timeout_seconds=spec.timeout_seconds,
                jobs_dir=jobs_dir,
                job_name=name,
                sandbox=spec.sandbox,
                network=spec.network,
                run_name=rollout.name,
            ),
        )
        return await _with_retries(
            executor,
            attempt,
            job_dir,
            max_retries=spec.max_retries,
            backoff_seconds=spec.retry_backoff_seconds,
            identity=(rollout.name, rollout.task, rollout.agent, rollout.model),
        )

    async with executor:
        return await _run_all([partial(one, rollout) for rollout in planned], job_dir, job_dir, console)


async def continue_job(
    job_dir: Path,
    *,
    concurrency: int,
    console: Console,
    model: str | None = None,
    timeout_seconds: float | None = None,
    tasks_dir: Path | None = None,
    sandbox: str | None = None,
    divergence_policy: DivergencePolicy = "warn",
    max_retries: int = 2,
    retry_backoff_seconds: float = 1.0,
    executor: str = "asyncio",
    max_starting: int = DEFAULT_MAX_STARTING,
    ray_address: str | None = None,
) -> JobSummary:
    """Continue every timed-out rollout of the job in `job_dir` (``reroll continue JOB_DIR --all``).

    Each continuation goes to ``job_dir/continued/<name>``; one already complete there is skipped,
    so the command can be run again after an interruption. The summary is written to
    ``job_dir/continued/summary.json``.

    Args:
        job_dir: a folder of run folders (a job folder, or a ``--jobs-dir/--job-name`` of `reroll run`).
        concurrency: most continuations running at once (≥ 1).
        model, timeout_seconds, tasks_dir, sandbox, divergence_policy: as for
            `reroll.resume.continue_run`.
        max_retries, retry_backoff_seconds: as in `JobSpec`, for infrastructure failures.
        executor, max_starting, ray_address: as in `JobSpec`.

    Raises:
        JobError: `job_dir` is not a folder, `concurrency` or `max_starting` < 1, or the executor
            is unknown or its package missing.
        InfrastructureError: the executor could not start (e.g. Ray).
    """
    if not job_dir.is_dir():
        raise JobError(f"job folder not found: {job_dir}")
    runner = create_executor(executor, ExecutorOptions(concurrency, max_starting, ray_address))
    job_dir = job_dir.resolve()
    output = job_dir / CONTINUED_DIR
    folders = _run_folders(job_dir)
    if not folders:
        raise JobError(f"{job_dir}: no run folders (folders with a config.json) in it")
    timed_out = [folder for folder in folders if _status(folder) == "timeout"]

    async def one(original: Path) -> RolloutSummary:
        config = RunConfig.model_validate_json((original / "config.json").read_bytes())
        task = config.task_name or Path(config.task_path).name
        target = output / original.name
        if is_complete(target):
            return summarise_rollout(
                target, task=task, agent=config.agent, model=model or config.model, attempts=0
            )
        if target.exists():
            _set_aside(target, output, "interrupted")
        attempt = Attempt(
            target,
            partial(
                continue_run,
                original,
                tasks_dir=tasks_dir.resolve() if tasks_dir else None,
                model=model,
                timeout_seconds=timeout_seconds,
                output=output,
                require_timeout=True,
                divergence_policy=divergence_policy,
                replay_only=False,
                sandbox=sandbox,
            ),
        )
        return await _with_retries(
            runner,
            attempt,
            output,
            max_retries=max_retries,
            backoff_seconds=retry_backoff_seconds,
            identity=(original.name, task, config.agent, model or config.model),
        )

    output.mkdir(exist_ok=True)
    async with runner:
        return await _run_all([partial(one, folder) for folder in timed_out], job_dir, output, console)


def _run_folders(job_dir: Path) -> list[Path]:
    """The run folders directly under `job_dir` (those with a config.json), sorted by name."""
    return sorted(p for p in job_dir.iterdir() if p.is_dir() and (p / "config.json").is_file())


def _status(folder: Path) -> str:
    result = read_result(folder)
    return result.effective_status if result is not None else "unknown"


async def _with_retries(
    executor: Executor,
    attempt: Attempt,
    parent: Path,
    *,
    max_retries: int,
    backoff_seconds: float,
    identity: tuple[str, str, str, str | None],
) -> RolloutSummary:
    """Run `attempt` on `executor` until it ends other than by an infrastructure error (of the
    rollout, or of the executor that lost it), or retries run out.

    `identity` is the rollout's (name, task, agent, model) for its summary.
    """
    _, task, agent, model = identity
    retried_errors: list[str] = []
    for number in range(1, max_retries + 2):
        try:
            outcome = await executor.run(attempt)
        except InfrastructureError as exc:  # the executor lost the attempt
            if number > max_retries:
                return _error_summary(identity, exc, number, retried_errors)
            retried_errors.append(str(exc))
            if attempt.run_dir.exists():
                _set_aside(attempt.run_dir, parent, f"attempt{number}")
            await asyncio.sleep(backoff_seconds * 2 ** (number - 1))
            continue
        except RerollError as exc:  # bad input found late (e.g. a task deleted meanwhile)
            return _error_summary(identity, exc, number, retried_errors)
        retry = outcome.result.error_category == "infrastructure" and number <= max_retries
        if not retry:
            return summarise_rollout(
                outcome.run_dir,
                task=task,
                agent=agent,
                model=model,
                attempts=number,
                retried_errors=retried_errors,
            )
        retried_errors.append(outcome.result.error or "")
        _set_aside(outcome.run_dir, parent, f"attempt{number}")
        await asyncio.sleep(backoff_seconds * 2 ** (number - 1))
    raise AssertionError("unreachable: the last attempt always returns")


def _error_summary(
    identity: tuple[str, str, str, str | None], exc: RerollError, attempts: int, retried_errors: list[str]
) -> RolloutSummary:
    """The summary of a rollout whose last attempt raised `exc` instead of leaving a result."""
    name, task, agent, model = identity
    category = "infrastructure" if isinstance(exc, InfrastructureError) else type(exc).__name__
    return RolloutSummary(
        name=name,
        task=task,
        agent=agent,
        model=model,
        status="error",
        error_category=category,
        error=str(exc),
        attempts=attempts,
        retried_errors=retried_errors,
    )


def _set_aside(folder: Path, parent: Path, reason: str) -> None:
    """Move `folder` to ``parent/_attempts/<name>.<reason>`` (``-2``, ``-3`` … if taken)."""
    aside = parent / ATTEMPTS_DIR
    aside.mkdir(exist_ok=True)
    target = aside / f"{folder.name}.{reason}"
    suffix = 2
    while target.exists():
        target = aside / f"{folder.name}.{reason}-{suffix}"
        suffix += 1
    shutil.move(folder, target)


async def _run_all(
    jobs: list[Callable[[], Awaitable[RolloutSummary]]],
    job_dir: Path,
    summary_dir: Path,
    console: Console,
) -> JobSummary:
    """Run `jobs` (each bounded by its executor) under a progress bar; write and print the summary."""
    started_at, started = now_iso(), time.monotonic()
    counts: Counter[str] = Counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task(_progress_text(counts), total=len(jobs))

        async def tracked(job: Callable[[], Awaitable[RolloutSummary]]) -> RolloutSummary:
            summary = await job()
            counts[summary.status] += 1
            progress.update(bar, advance=1, description=_progress_text(counts))
            return summary

        rollouts = await asyncio.gather(*(tracked(job) for job in jobs))
    summary = JobSummary(
        job=job_dir.name,
        path=str(job_dir.resolve()),
        started_at=started_at,
        finished_at=now_iso(),
        wall_seconds=round(time.monotonic() - started, 3),
        rollouts=list(rollouts),
        totals=totals(list(rollouts)),
    )
    write_json(summary_dir / SUMMARY_FILE, summary)
    print_summary(summary, console)
    console.print(f"summary: {summary_dir / SUMMARY_FILE}")
    return summary


def _progress_text(counts: Counter[str]) -> str:
    return " · ".join(f"{status} {counts.get(status, 0)}" for status in ("ok", "timeout", "error")) + (
        f" · unknown {counts['unknown']}" if counts.get("unknown") else ""
    )
