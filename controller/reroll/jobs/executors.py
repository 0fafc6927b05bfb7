"""Where a job's rollouts run: the `Executor` seam, its lazy registry, and the asyncio executor.

A job (`reroll.jobs.runner`) hands each attempt of each rollout to an executor as an `Attempt` — plain
data (a picklable `functools.partial` of `reroll.rollout.commands.record.run_task`,
`reroll.rollout.commands.continue_.continue_run` or `reroll.jobs.branch.run_branch`), so it can
be shipped to another process. Retries, backoff, resume and the progress bar and summary stay in
the job's loop, whatever the executor: an executor only runs one attempt and returns its
`RolloutOutcome`.

Executors, by name (``reroll job --executor NAME``), imported only when used:

- ``asyncio`` (default): every rollout in this process's event loop, at most ``concurrency`` at
  once, at most ``max_starting`` of them in their start-up phase (model server, LLM proxy,
  sandbox) at once, the first of them alone (`HeadStartGate`).
- ``ray``: each attempt is a Ray task (`reroll.jobs.ray_executor`), its task folder shipped to the
  worker and its run folder back; needs ``pip install 'reroll[ray]'``.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol

from reroll_contracts.errors import JobError

from reroll.host.open_files import open_files_for
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import script_file
from reroll.rollout.start import RolloutOutcome
from reroll.settings import RolloutSettings

EXECUTORS: dict[str, str] = {
    "asyncio": "reroll.jobs.executors:AsyncioExecutor",
    "ray": "reroll.jobs.ray_executor:RayExecutor",
}
"""Executor name → ``module:class``, imported only when used."""

EXTRAS: dict[str, str] = {"ray": "reroll[ray]"}
"""Executor name → the pip requirement that brings its optional dependency."""

REMOTE_EXECUTORS = frozenset({"ray"})
"""Executors whose attempts may run on other machines: only what `Attempt.reads` names reaches them
(`reroll.jobs.runner` refuses before a job starts what cannot travel)."""


@dataclass(frozen=True)
class RecordedTask:
    """The task a continuation or a branch finds through its recording (not an argument of its call)."""

    name: str
    """The name the recording looks the task up by in ``tasks_dir``
    (`reroll.rollout.checkpoint.original_task_name`)."""
    path: Path
    """The task folder found on the controller (absolute)."""


@dataclass(frozen=True)
class Attempt:
    """One attempt of one rollout, as data that pickles (a Ray task receives it as it is).

    What it reads and writes is declared, so an executor on another machine can carry it there
    and back (`reroll.jobs.ray_executor`): every `pathlib.Path` among the bound arguments of `run`,
    every path its ``options`` name (`reroll.rollout.start.RolloutSettings.paths_read`) and the
    script of its ``model`` (``scripted:PATH``) is one of `reads` (or inside one), the run folder
    or one of its parents (`attempt_reads` collects them).
    """

    run_dir: Path
    """The run folder the attempt writes (absolute); a job sets it aside when the attempt is retried."""
    run: Callable[..., Awaitable[RolloutOutcome]]
    """``run(start_gate=...)`` runs the attempt: a `functools.partial` of
    `reroll.rollout.commands.record.run_task`, `reroll.rollout.commands.continue_.continue_run` or
    `reroll.jobs.branch.run_branch` with every other argument bound."""
    reads: tuple[Path, ...] = ()
    """The folders and files (absolute) the attempt reads, each bound as an argument of `run`: the
    task folder of a new rollout, the recorded run folder of a continuation or branch, and
    `attempt_reads`'s others."""
    recorded_task: RecordedTask | None = None
    """A continuation's or branch's task, which `run` finds through its ``tasks_dir`` argument or the
    recording; None when it could not be found (the attempt then fails on it, naming it)."""

    @property
    def folders_read(self) -> tuple[Path, ...]:
        """Every folder the attempt reads: `reads`, then the recorded task's folder, if any."""
        task = (self.recorded_task.path,) if self.recorded_task is not None else ()
        return (*self.reads, *task)


def attempt_reads(*folders: Path, options: RolloutSettings, model: str | None) -> tuple[Path, ...]:
    """`Attempt.reads` of an attempt whose call binds `folders`, `options` and the live `model`
    (absolute, `reroll.models.spec.resolved_spec`): `folders`, the paths of `options`
    (`RolloutSettings.paths_read`) and the model's script file, once each, in that order."""
    script = script_file(model) if model is not None else None
    paths = (*folders, *options.paths_read(), *([script] if script is not None else []))
    return tuple(dict.fromkeys(paths))


class Executor(Protocol):
    """Runs attempts of rollouts; used as an async context manager around a whole job.

    Entering starts what the executor needs (nothing, or a Ray connection); leaving releases it.
    """

    async def __aenter__(self) -> Executor: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    async def run(self, attempt: Attempt) -> RolloutOutcome:
        """Run `attempt` to its end (waiting for a free slot first) and return its outcome.

        Raises:
            InfrastructureError: the executor lost the attempt (e.g. its Ray worker died); the
                job retries it like an infrastructure failure of the rollout itself.
            RerollError: the attempt found bad input late (e.g. its task folder was deleted).
        """
        ...


class HeadStartGate(asyncio.Semaphore):
    """The start gate of a job's rollouts: at most `value` hold it at once, and the first task to
    ask for it holds it alone: the others wait until it released it (its start done, or failed).

    The first rollout of a job, or the first child of a branch, holds it until its agent is
    launched (`reroll.rollout.lifecycle.execute_rollout`): it starts its sandbox and its sidecar,
    records its verifier's baseline and launches its agent without sharing the machine's cores
    (and the shared proxy) with the others' starts: its first request (a branch's fork latency)
    comes sooner, the others' starts follow it by one start. Use it as
    `asyncio.Semaphore` (``async with``), each holder acquiring and releasing in its own task.

    Args:
        value: the most holders at once, >= 1.
    """

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self._first: asyncio.Task[object] | None = None
        self._first_done = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        """Wait for a place, and for the first holder to be done unless this is the first."""
        task = asyncio.current_task()
        if self._first is None:
            self._first = task
        elif task is not self._first:
            await self._first_done.wait()
        try:
            return await super().acquire()
        except BaseException:  # cancelled: it will hold nothing, so it holds no one back
            if task is self._first:
                self._first_done.set()
            raise

    def release(self) -> None:
        """Give the place back; the first holder's release lets the others in."""
        super().release()
        if asyncio.current_task() is self._first:
            self._first_done.set()


class AsyncioExecutor:
    """Runs attempts as coroutines of this process's event loop.

    At most ``options.concurrency`` attempts run at once; within them at most
    ``options.max_starting`` are starting (model server, LLM proxy, sandbox and its sidecar) at
    once, so that many rollouts starting together on few cores do not hit the 30 s start-up
    timeouts of those processes; the first attempt starts alone (`HeadStartGate`).

    Raises:
        JobError: this process's limit of open files cannot hold ``options.concurrency``
            rollouts (`reroll.host.open_files.open_files_for`, which raises its soft limit first).
    """

    def __init__(self, options: RunnerOptions) -> None:
        open_files_for(options.concurrency)
        self._slots = asyncio.Semaphore(options.concurrency)
        self._starting = HeadStartGate(options.max_starting)

    async def __aenter__(self) -> AsyncioExecutor:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    async def run(self, attempt: Attempt) -> RolloutOutcome:
        """Run `attempt` in this event loop once a slot is free; see `Executor.run`."""
        async with self._slots:
            return await attempt.run(start_gate=self._starting)


def create_executor(options: RunnerOptions) -> Executor:
    """Build (not enter) the executor ``options.executor`` names, bounded as `options` says
    (`RunnerOptions` has checked the bounds: ``concurrency`` and ``max_starting`` are at least 1).

    Raises:
        JobError: the name is unknown, or the executor's optional package is not installed (the
            message says what to install), or the host cannot hold ``concurrency`` rollouts.
    """
    name = options.executor
    try:
        target = EXECUTORS[name]
    except KeyError:
        raise JobError(f"unknown executor {name!r}; known: {', '.join(sorted(EXECUTORS))}") from None
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = EXTRAS.get(name, "its dependencies")
        raise JobError(f"executor {name!r} needs a missing package ({exc}): pip install '{extra}'") from exc
    executor: Executor = getattr(module, class_name)(options)
    return executor
