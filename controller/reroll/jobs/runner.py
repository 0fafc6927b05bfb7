"""Jobs: many rollouts (tasks x agents x models x repeats) at bounded concurrency.

``reroll job`` / `run_job` runs a `JobSpec` into ``<jobs-dir>/<job>/``::

    <job>/
      job.json                      the resolved JobSpec (``reroll job --resume <job>`` reads it)
      <task>__<agent>__<model>__r<k>/   one run folder per rollout (names are deterministic)
      _attempts/                    folders of failed attempts that were retried, or cut short
      summary.json                  JobSummary (see reroll.runfolder.summary), rewritten at the end
      continued/                    ``reroll continue-job <job>``: one continuation per timed-out run
      store/                        ``schedule: sequential-shared``: its learner store (reroll.jobs.learning)

Schedule: ``parallel-independent`` (the default) runs the rollouts at once, bounded by the
executor; ``sequential-shared`` runs them in plan order, one at a time, each from the learner
store's head generation, and records the store its agent left as the next generation.

Retries: a rollout that ends with ``error_category: infrastructure`` (its proxy, model server or
sandbox did not start or died: `reroll_contracts.errors.InfrastructureError`, the one retryable branch of
the tree) runs again, up to ``max_retries`` more times, after ``retry_backoff_seconds * 2 ** (k -
1)`` seconds; an agent timeout, an agent error or a configuration error (``config``: e.g. an
unknown sandbox backend) is an outcome, never retried. A rollout that raises instead of leaving a
result ends in the summary with status ``error`` (category ``internal`` for a bug, with its
traceback), so summary.json is written whatever happens. The failed attempt's folder is moved to
``_attempts/``, so the rollout's name always holds its last attempt.

Executors (`reroll.jobs.executors`): each attempt runs on the job's executor — ``asyncio`` (this
process, the default) or ``ray`` (one Ray task per attempt). Retries, backoff, resume, the
progress bar and the summary are this module's, the same for every executor; an attempt the
executor lost (a Ray worker died) is retried like an infrastructure failure.

The same runner (`Runner`: executor, retries, resume, progress bar) runs a job's rollouts,
``reroll continue-job``'s continuations and ``reroll branch``'s branches (`reroll.jobs.branch`).

Resume: running a job into an existing job folder skips every rollout whose folder holds a
complete result.json (status and ``finished_at`` set); a folder without one (the job was
interrupted there) is moved to ``_attempts/`` and the rollout runs again.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import (
    RETRIED_CATEGORIES,
    JobError,
    RerollError,
    RunFolderError,
    TaskError,
    error_category,
)
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from reroll.jobs.executors import (
    REMOTE_EXECUTORS,
    Attempt,
    Executor,
    RecordedTask,
    attempt_reads,
    create_executor,
)
from reroll.jobs.jobfile import JobSpec, RunnerOptions
from reroll.jobs.learning import (
    next_use,
    record_generation,
    resumed_generation,
    start_store,
    with_generations,
)
from reroll.jobs.planning import PlannedRollout, plan_rollouts
from reroll.jobs.report import print_summary
from reroll.models.spec import check_model, resolved_spec
from reroll.rollout.checkpoint import find_original_task, original_task_name
from reroll.rollout.commands.continue_ import check_continuation, continue_run
from reroll.rollout.commands.record import run_task
from reroll.rollout.trust import refuse_untrusted
from reroll.runfolder.folders import job_run_folders
from reroll.runfolder.paths import JobPaths, RunPaths
from reroll.runfolder.run import MAX_JSON_BYTES, RunConfig, StoreUse, now_iso, write_json
from reroll.runfolder.store import summarise_store
from reroll.runfolder.summary import (
    JobSummary,
    RolloutSummary,
    is_complete,
    read_result,
    summarise_rollout,
    totals,
)
from reroll.sandbox.base import load_backend
from reroll.settings import RolloutSettings, with_recorded_inputs

Step = Callable[[], Awaitable[RolloutSummary]]
"""One rollout's part of a run (`Runner.run_steps`): runs it, returns its summary."""


@dataclass(frozen=True)
class RunnerRollout:
    """One rollout handed to a `Runner`: how to run an attempt of it, and its summary's identity."""

    attempt: Attempt
    """Its run folder (the summary's ``name`` is the folder's name) and the attempt's call."""
    task: str
    agent: str
    model: str | None


class Runner:
    """Runs rollouts on an executor: retries, backoff, resume, a progress bar (module docstring).

    Built before anything is written, so bad options are refused first.
    """

    def __init__(self, options: RunnerOptions) -> None:
        """Build the executor `options` names (not started yet).

        Raises:
            JobError: the executor is unknown or its package missing, or this process's limit of
                open files cannot hold ``options.concurrency`` rollouts.
        """
        self._options = options
        self._executor = create_executor(options)

    async def run(self, rollouts: Sequence[RunnerRollout], console: Console) -> list[RolloutSummary]:
        """Run every rollout to its end, under a progress bar on `console`; their summaries, in order.

        A rollout whose folder holds a complete result.json is skipped (``attempts`` 0); a folder
        without one (cut short) is moved to ``_attempts/`` first.

        Raises:
            InfrastructureError: the executor could not start (e.g. Ray).
        """
        return await self.run_steps([partial(self.run_one, rollout) for rollout in rollouts], console)

    async def run_steps(
        self, steps: Sequence[Step], console: Console, *, in_order: bool = False
    ) -> list[RolloutSummary]:
        """Run `steps` (each ends in one rollout's summary, e.g. `run_one`) under a progress bar
        on `console`: at once (each bounded by the executor), or one after the other when
        `in_order`; their summaries, in order.

        Raises:
            InfrastructureError: the executor could not start (e.g. Ray).
        """
        async with self._executor:
            return await _run_all(list(steps), console, in_order=in_order)

    async def run_one(self, rollout: RunnerRollout) -> RolloutSummary:
        """Run `rollout` with retries (or skip it when complete; see `run`); its summary."""
        folder = rollout.attempt.run_dir
        identity = (folder.name, rollout.task, rollout.agent, rollout.model)
        if is_complete(folder):
            return summarise_rollout(
                folder, task=rollout.task, agent=rollout.agent, model=rollout.model, attempts=0
            )
        if folder.exists():
            _set_aside(folder, folder.parent, "interrupted")
        return await _with_retries(
            self._executor,
            rollout.attempt,
            folder.parent,
            max_retries=self._options.max_retries,
            backoff_seconds=self._options.retry_backoff_seconds,
            identity=identity,
        )


async def run_job(spec: JobSpec, *, jobs_dir: Path, console: Console) -> JobSummary:
    """Run (or resume) the job `spec` into ``jobs_dir/<name>``; see the module docstring.

    Shows a progress bar and, at the end, the summary table on `console`; writes job.json
    first and summary.json last.

    Returns:
        The summary, as written to summary.json.

    Raises:
        TaskError, AgentError, ModelError, JobError, SandboxBackendError: bad input (an unknown
            executor or sandbox backend, or one whose package is missing, included), before
            anything runs.
        InfrastructureError: the executor could not start (e.g. Ray).
    """
    options, trial = spec.settings(), spec.trial_config()
    planned = plan_rollouts(spec, options)
    runner = Runner(spec)
    name = spec.name or datetime.now(UTC).strftime("%Y-%m-%d__%H-%M-%S")
    jobs_dir = jobs_dir.resolve()  # attempts may run in other processes (Ray workers)
    job_dir = jobs_dir / name
    saved = spec.model_copy(update={"name": name})
    job_dir.mkdir(parents=True, exist_ok=True)
    write_json(JobPaths(job_dir).spec, saved.model_dump(mode="json"))

    def runner_rollout(rollout: PlannedRollout, store: StoreUse | None = None) -> RunnerRollout:
        model, rollout_options = (
            resolved_spec(rollout.model),
            options.model_copy(update={"learner_store": store}),
        )
        run = partial(
            run_task,
            rollout.task_path,
            agent_name=rollout.agent,
            model=model,
            trial=trial,
            options=rollout_options,
            jobs_dir=jobs_dir,
            job_name=name,
            run_name=rollout.name,
        )
        reads = attempt_reads(rollout.task_path, options=rollout_options, model=model)
        attempt = Attempt(JobPaths(job_dir).run(rollout.name).root, run, reads=reads)
        return RunnerRollout(attempt, rollout.task, rollout.agent, rollout.model)

    if spec.schedule == "sequential-shared":
        store = start_store(job_dir, spec.store)
        steps = [partial(_shared_step, runner, store, rollout, runner_rollout) for rollout in planned]
        return await _summarised(runner, steps, job_dir, job_dir, console, store=store)
    steps = [partial(runner.run_one, runner_rollout(rollout)) for rollout in planned]
    return await _summarised(runner, steps, job_dir, job_dir, console)


async def _shared_step(
    runner: Runner,
    store: Path,
    rollout: PlannedRollout,
    runner_rollout: Callable[[PlannedRollout, StoreUse | None], RunnerRollout],
) -> RolloutSummary:
    """Run `rollout` of a sequential-shared job from the store's head generation, and record the
    store its agent left as the next one (`reroll.jobs.learning`)."""
    folder = store.parent / rollout.name
    if is_complete(folder):  # done by an earlier run of the job: `run_one` skips it
        made = resumed_generation(store, folder)
        summary = await runner.run_one(runner_rollout(rollout, None))
        return with_generations(summary, made.parent if made is not None else None, made)
    use = next_use(store)
    summary = await runner.run_one(runner_rollout(rollout, use))
    return with_generations(summary, use.generation, record_generation(store, folder, use))


async def continue_job(
    job_dir: Path,
    *,
    console: Console,
    model: str | None = None,
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
    runner: RunnerOptions = RunnerOptions(),
) -> JobSummary:
    """Continue every timed-out rollout of the job in `job_dir` (``reroll continue-job JOB_DIR``).

    Each continuation replays its whole recording, then goes live, into
    ``job_dir/continued/<name>``; one already complete there is skipped, so the command can be
    run again after an interruption. The summary is written to ``job_dir/continued/summary.json``.

    Args:
        job_dir: a folder of run folders (a job folder, or a ``--jobs-dir/--job-name`` of `reroll run`).
        console: where the progress bar and the summary table go.
        model: the live model after the cut [default: each original's].
        tasks_dir: folder holding the tasks [default: each recorded ``task_path``].
        options: how each continuation runs (as for `reroll.rollout.commands.continue_.continue_run`);
            its ``user_model`` (``--user-model``) plays the persona User of the runs that have one
            (the others run without it).
        runner: concurrency, executor, retries (as in `JobSpec`).

    Raises:
        JobError: `job_dir` is not a folder or holds no run folder, or the executor is unknown or
            its package missing; or the executor runs rollouts on other machines and a timed-out
            run reads a host file that does not travel (`refuse_untravelled`).
        SandboxBackendError: ``options.sandbox`` names no backend, or its package is missing, or
            ``options.sandbox_config`` is not valid for it.
        ModelError: `model` or ``options.user_model`` cannot be resolved (an unknown provider, a
            missing key, a missing ``scripted:PATH``), or a timed-out run's task names a judge model
            that cannot (`_check_continuation`): refused before any continuation starts.
        InfrastructureError: the executor could not start (e.g. Ray).
    """
    if not job_dir.is_dir():
        raise JobError(f"job folder not found: {job_dir}")
    batch = Runner(runner)
    if options.sandbox is not None:
        load_backend(options.sandbox).typed(options.sandbox_config)
    for spec in (model, options.user_model):
        if spec is not None:
            check_model(spec)
    job_dir = job_dir.resolve()
    output = JobPaths(job_dir).continued.root
    folders = job_run_folders(job_dir)
    if not folders:
        raise JobError(f"{job_dir}: no run folders (folders with a config.json) in it")
    rollouts = [
        _continuation(original, output, model, tasks_dir, options, runner.executor)
        for original in folders
        if _status(original) == "timeout"
    ]
    output.mkdir(exist_ok=True)
    steps = [partial(batch.run_one, rollout) for rollout in rollouts]
    return await _summarised(batch, steps, job_dir, output, console)


def _continuation(
    original: Path,
    output: Path,
    model: str | None,
    tasks_dir: Path | None,
    options: RolloutSettings,
    executor: str,
) -> RunnerRollout:
    """The job runner's rollout continuing the timed-out run `original` into ``output/<name>``
    (`continue_job`'s arguments): its recorded inputs bound in `options`
    (`reroll.settings.with_recorded_inputs`), checked first as `continue_job` says.

    Raises:
        JobError, UntrustedCodeError, SandboxBackendError, ModelError: as `continue_job`.
    """
    config = _config(original)
    if config is not None:
        refuse_untravelled(config, original, executor)
        refuse_untrusted(config, original, options.trust)  # before anything it names is imported
    live = resolved_spec(model or (config.model if config is not None else None))
    bound = with_recorded_inputs(_persona_only(options, config), config) if config is not None else options
    if config is not None:
        _check_continuation(original, live, tasks_dir, bound)
    run = partial(
        continue_run,
        original,
        model=live,
        require_timeout=True,
        tasks_dir=tasks_dir.resolve() if tasks_dir else None,
        options=bound,
        output=output,
    )
    task, agent, original_model = _identity(config, original)
    attempt = Attempt(
        output / original.name,
        run,
        reads=attempt_reads(original, options=bound, model=live),
        recorded_task=_recorded_task(config, tasks_dir.resolve() if tasks_dir else None),
    )
    return RunnerRollout(attempt, task, agent, model or original_model)


def _check_continuation(
    original: Path, model: str | None, tasks_dir: Path | None, options: RolloutSettings
) -> None:
    """Refuse the whole job, before anything runs, when continuing `original` would be refused for
    a reason every continuation shares (`reroll.rollout.commands.continue_.check_continuation`: the
    judge's or User's model, MCP, skills …). A fault of the run folder or its task is the run's
    own: its continuation ends in error in the summary, as without this check."""
    try:
        check_continuation(
            original,
            model=model,
            require_timeout=True,
            tasks_dir=tasks_dir.resolve() if tasks_dir else None,
            options=options,
        )
    except (RunFolderError, TaskError):
        return


def _persona_only(options: RolloutSettings, config: RunConfig) -> RolloutSettings:
    """`options` for a continuation of the run whose config.json is `config`: ``user_model`` (the
    job's ``--user-model``) kept only when its trial has a persona User to play."""
    persona = config.trial.persona if config.trial is not None else None
    return options if persona is not None else options.model_copy(update={"user_model": None})


def _config(folder: Path) -> RunConfig | None:
    """config.json of run folder `folder`, or None when it cannot be read (its continuation then
    fails on it, naming the file, and the job's summary is written all the same)."""
    try:
        return RunConfig.model_validate_json(read_data_file(RunPaths(folder).config, MAX_JSON_BYTES))
    except (OSError, ValueError):  # ValueError: ValidationError, DataFileError
        return None


def _identity(config: RunConfig | None, folder: Path) -> tuple[str, str, str | None]:
    """(task, agent, model) of run folder `folder` (its config.json: `config`) for its summary;
    ``unknown`` for the task and agent when its config.json could not be read."""
    if config is None:
        return "unknown", "unknown", None
    return config.task_name or Path(config.task_path).name, config.agent, config.model


def _recorded_task(config: RunConfig | None, tasks_dir: Path | None) -> RecordedTask | None:
    """The task of a run folder (its config.json: `config`) as its continuation will find it, or
    None when it cannot be found (the continuation then fails on it, naming it)."""
    if config is None:
        return None
    try:
        return RecordedTask(original_task_name(config), find_original_task(config, tasks_dir).path)
    except RerollError:
        return None


def refuse_untravelled(config: RunConfig, folder: Path, executor: str) -> None:
    """Refuse a continuation or branch of the run in `folder` (its config.json: `config`) on
    `executor` when that runs rollouts on other machines (`REMOTE_EXECUTORS`) and the rollout
    reads a host file that does not travel there: a trial's User held in a file
    (``path/to/file.py:attribute``: Python code importing what lies beside it, which a single
    file's copy would not carry).

    Raises:
        JobError: naming the run, the User and what to do instead.
    """
    files = config.trial.user_files() if config.trial is not None else []
    if files and executor in REMOTE_EXECUTORS:
        raise JobError(
            f"{folder}: its trial's User {files[0]} is a file on this machine, which does not travel "
            f"to {executor} workers; make it an importable module:attribute installed on every node, "
            "or use --executor asyncio"
        )


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
    """Run `attempt` on `executor` until it ends other than by a retryable error (an
    infrastructure error of the rollout, or of the executor that lost it), or retries run out.

    Never raises (but for cancellation): an attempt that raises instead of leaving a result gets a
    summary with status ``error``, its error's category (``internal`` for an exception outside
    `reroll_contracts.errors`) and, for such a bug, its traceback as the error text.

    `identity` is the rollout's (name, task, agent, model) for its summary.
    """
    _, task, agent, model = identity
    retried_errors: list[str] = []
    for number in range(1, max_retries + 2):
        try:
            outcome = await executor.run(attempt)
        except Exception as exc:  # the executor lost the attempt, bad input found late, or a bug
            if not (isinstance(exc, RerollError) and exc.retryable and number <= max_retries):
                return _error_summary(identity, exc, number, retried_errors)
            retried_errors.append(str(exc))
            if attempt.run_dir.exists():
                _set_aside(attempt.run_dir, parent, f"attempt{number}")
            await asyncio.sleep(backoff_seconds * 2 ** (number - 1))
            continue
        retry = outcome.result.error_category in RETRIED_CATEGORIES and number <= max_retries
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
    identity: tuple[str, str, str, str | None], exc: Exception, attempts: int, retried_errors: list[str]
) -> RolloutSummary:
    """The summary of a rollout whose last attempt raised `exc` instead of leaving a result."""
    name, task, agent, model = identity
    error = str(exc)
    if not isinstance(exc, RerollError):  # a bug: keep its traceback
        error = "internal error: " + "".join(traceback.format_exception(exc))
    return RolloutSummary(
        name=name,
        task=task,
        agent=agent,
        model=model,
        status="error",
        error_category=error_category(exc),
        error=error,
        attempts=attempts,
        retried_errors=retried_errors,
    )


def _set_aside(folder: Path, parent: Path, reason: str) -> None:
    """Move `folder` to ``parent/_attempts/<name>.<reason>`` (``-2``, ``-3`` … if taken)."""
    aside = JobPaths(parent).attempts
    aside.mkdir(exist_ok=True)
    target = aside / f"{folder.name}.{reason}"
    suffix = 2
    while target.exists():
        target = aside / f"{folder.name}.{reason}-{suffix}"
        suffix += 1
    shutil.move(folder, target)


async def _summarised(
    runner: Runner,
    steps: Sequence[Step],
    job_dir: Path,
    summary_dir: Path,
    console: Console,
    *,
    store: Path | None = None,
) -> JobSummary:
    """Run `steps` (in order when the job has a learner `store`); write the job summary to
    `summary_dir` and print it."""
    started_at, started = now_iso(), time.monotonic()
    summaries = await runner.run_steps(steps, console, in_order=store is not None)
    summary = JobSummary(
        job=job_dir.name,
        path=str(job_dir.resolve()),
        started_at=started_at,
        finished_at=now_iso(),
        wall_seconds=round(time.monotonic() - started, 3),
        rollouts=summaries,
        totals=totals(summaries),
        schedule="sequential-shared" if store is not None else "parallel-independent",
        store=summarise_store(store) if store is not None else None,
    )
    write_json(JobPaths(summary_dir).summary, summary)
    print_summary(summary, console)
    console.print(f"summary: {JobPaths(summary_dir).summary}")
    return summary


async def _run_all(jobs: list[Step], console: Console, *, in_order: bool = False) -> list[RolloutSummary]:
    """Run `jobs` (each bounded by its executor; one after the other when `in_order`) under a
    progress bar; their summaries, in order."""
    counts: Counter[str] = Counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
        bar = progress.add_task(_progress_text(counts), total=len(jobs))

        async def tracked(job: Step) -> RolloutSummary:
            summary = await job()
            counts[summary.status] += 1
            progress.update(bar, advance=1, description=_progress_text(counts))
            return summary

        if in_order:
            return [await tracked(job) for job in jobs]
        return list(await asyncio.gather(*(tracked(job) for job in jobs)))


def _progress_text(counts: Counter[str]) -> str:
    return " · ".join(f"{status} {counts.get(status, 0)}" for status in ("ok", "timeout", "error")) + (
        f" · unknown {counts['unknown']}" if counts.get("unknown") else ""
    )
