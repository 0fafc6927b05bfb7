"""What the command modules of ``reroll`` share: the consoles, the options of several commands that
are not rollout settings (one definition each, so their names and help read the same everywhere;
the settings' flags are `reroll.cli.flags`), and the helpers that turn errors into exit codes.

Nothing of a command's implementation is imported here or at the top of a command's module: a
command's function imports what it runs when it runs, so ``reroll --help``, ``reroll CMD --help``
and every other command do not load it (``tests/cli/test_app.py``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, RerollError
from rich.console import Console

from reroll.cli import early

if TYPE_CHECKING:
    from reroll.jobs.jobfile import RunnerOptions
    from reroll.rollout.start import RolloutOutcome
    from reroll.runfolder.summary import JobSummary

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

ExecutorOption = Annotated[
    str | None, typer.Option(help="Where rollouts run: asyncio (this process) or ray [default: asyncio].")
]
MaxStartingOption = Annotated[
    int | None, typer.Option(help="Rollouts starting (model server, proxy, sandbox) at once [default: 4].")
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        envvar="RAY_ADDRESS",
        help="--executor ray: cluster to join (auto, HOST:6379, ray://HOST:10001) [default: a local one].",
    ),
]
MaxRetriesOption = Annotated[
    int | None, typer.Option(help="Retries of infrastructure failures [default: 2].")
]
TasksDirOption = Annotated[
    Path | None, typer.Option(help="Folder holding the task [default: the recorded task_path].")
]
AtOption = Annotated[
    str | None,
    typer.Option(
        help="Checkpoint: replay this many exchanges (0..N), a fraction of them (e.g. 0.5), or in a "
        "trial TURN:STEP (the STEP-th exchange of turn TURN; a User's round is a turn)."
    ),
]

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on uvloop when installed, else asyncio's loop: the loop the console
    script started a branch's shared processes on, if it did (`reroll.cli.early.run`)."""
    return early.run(coro)


def runner_options(
    concurrency: int | None,
    max_starting: int | None,
    executor: str | None,
    ray_address: str | None,
    max_retries: int | None,
) -> RunnerOptions:
    """The runner flags (``continue-job``, ``branch``), checked: out of range exits with code 2."""
    from reroll.jobs.jobfile import RunnerOptions  # the job file's models: loaded by the commands that run

    flags = {
        "concurrency": concurrency,
        "max_starting": max_starting,
        "executor": executor,
        "ray_address": ray_address,
        "max_retries": max_retries,
    }
    try:
        return RunnerOptions.model_validate({key: value for key, value in flags.items() if value is not None})
    except ValidationError as exc:
        err_console.print(f"[red]error:[/red] the command line: invalid runner flags:\n{exc}")
        raise typer.Exit(2) from None


def finish(outcome: RolloutOutcome) -> None:
    """Print how a rollout ended; exit 1 when its status is ``error``."""
    from reroll.runfolder.run import SIDE_LABELS  # the run folder's models: loaded once a rollout ran

    result = outcome.result
    colour = {"ok": "green", "timeout": "yellow"}.get(result.status or "", "red")
    console.print(
        f"status:  [{colour}]{result.status}[/{colour}]" + (f" — {result.error}" if result.error else "")
    )
    console.print(f"rewards: {result.rewards}")
    counts = result.counts
    console.print(
        f"exchanges served: {counts.exchanges} ({counts.replayed} replayed, {counts.live} live, "
        f"{counts.divergences} divergent)"
    )
    if result.mcp_withheld:
        console.print(f"without MCP: the task's servers {', '.join(result.mcp_withheld)} were not offered")
    for who, side in result.side_counts().items():
        console.print(
            f"{SIDE_LABELS[who]} exchanges: {side.exchanges} ({side.replayed} replayed, {side.live} live, "
            f"{side.divergences} divergent)"
        )
    console.print(f"run folder: {outcome.run_dir}")
    if result.status == "error":
        raise typer.Exit(1)


def refuse(exc: RerollError) -> NoReturn:
    """Print `exc` and exit: code 2 for bad input (a `ConfigError`, refused before anything is
    written), 1 for any other error of reroll's tree (e.g. Docker or Ray cannot be reached)."""
    err_console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2 if isinstance(exc, ConfigError) else 1) from None


def guarded(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; a `RerollError` is printed and exits (see `refuse`)."""
    try:
        return run_coroutine(coro)
    except RerollError as exc:
        refuse(exc)


def job_guarded(coro: Coroutine[Any, Any, JobSummary]) -> None:
    """Run a job; exit 2 on bad input, 1 if any rollout ended in error (or see `refuse`), else 0."""
    try:
        summary = run_coroutine(coro)
    except RerollError as exc:
        refuse(exc)
    counts = summary.totals.status_counts
    if counts.get("error", 0) + counts.get("unknown", 0):
        raise typer.Exit(1)
