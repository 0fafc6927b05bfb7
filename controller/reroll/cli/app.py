"""The ``reroll`` command line (typer).

Exit codes: 0 the rollout ran (status ``ok`` or ``timeout``); 1 it ended with status ``error``
(agent crash, strict divergence, verifier failure) — for ``replay``: the rebuild is not
faithful; for ``branch``, ``job``, ``continue-job``: a rollout ended in error — or the command
failed on something other than its input (Docker or Ray unreachable); 2 bad input (a
`reroll_contracts.errors.ConfigError`: missing task, unknown agent or sandbox backend, missing provider
key, corrupt run folder, ``--at`` out of range …, a flag the command does not take), reported
before anything is written.

``continue`` continues one run; ``continue-job`` every timed-out run of a job folder, on the job
runner (`reroll.jobs.runner.Runner`): two commands, so each has only the flags it honours.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
import typer.core
from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, RerollError
from reroll_contracts.faults import FaultsUsed
from reroll_contracts.network import NetworkPolicy
from reroll_contracts.proxy import DivergencePolicy
from rich.console import Console
from typer import _click  # typer's own copy of click: the types TyperGroup's methods take

from reroll import __version__
from reroll.agents import registry
from reroll.cli.reports import branch_report, fidelity_report
from reroll.export import ExportFormat
from reroll.host.llm_proxy import faults_used
from reroll.jobs.branch import branch as branch_run
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.continue_ import continue_run
from reroll.rollout.record import run_task
from reroll.rollout.replay import replay_run
from reroll.rollout.start import RolloutOptions, RolloutOutcome
from reroll.runfolder.run import write_bytes_atomically
from reroll.trials.config import load_trial

if TYPE_CHECKING:
    from reroll.runfolder.summary import JobSummary


# Help and usage errors as click renders them (rich_markup_mode=None), not as rich panels: rich's
# option table cuts option names to fit (`--no-require-ti…` at 80 columns, the width of any pipe or
# CI log) and reads the `[default: …]` of help texts as markup; click wraps help texts and prints
# every option name whole.
class PlainHelpGroup(typer.core.TyperGroup):
    """A command group whose help lists each command with its whole first sentence, wrapped
    (click would cut it to the width, ending it with ``...``)."""

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = [
            (name, command.get_short_help_str(limit=sys.maxsize))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    help="reroll: run LLM agents in sandboxes, record every LLM exchange, replay and continue runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainHelpGroup,
    rich_markup_mode=None,
)
model_app = typer.Typer(
    help="The bundled scripted model server.", no_args_is_help=True, cls=PlainHelpGroup, rich_markup_mode=None
)
app.add_typer(model_app, name="model")
sandbox_app = typer.Typer(
    help="Sandbox housekeeping.", no_args_is_help=True, cls=PlainHelpGroup, rich_markup_mode=None
)
app.add_typer(sandbox_app, name="sandbox")
task_app = typer.Typer(help="Task folders.", no_args_is_help=True, cls=PlainHelpGroup, rich_markup_mode=None)
app.add_typer(task_app, name="task")
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

SandboxOption = Annotated[
    str | None,
    typer.Option(
        help="Sandbox backend: local (isolated by namespaces), local-plain, docker, or a dotted path "
        "(package.module:Class)."
    ),
]
NetworkOption = Annotated[
    NetworkPolicy | None,
    typer.Option(help="Egress: none (only the LLM proxy; local or docker) or full [default: the task's]."),
]
ImageMapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--image-map",
        help="Build a task's Dockerfile FROM a local image instead: SRC=DST, e.g. "
        "ubuntu:24.04=reroll/base:bookworm (repeatable; docker sandbox; no registry needed).",
    ),
]
ExecutorOption = Annotated[
    str | None, typer.Option(help="Where rollouts run: asyncio (this process) or ray [default: asyncio].")
]
MaxStartingOption = Annotated[
    int | None, typer.Option(help="Rollouts starting (model server, proxy, sandbox) at once [default: 4].")
]
RayAddressOption = Annotated[
    str | None, typer.Option(help="--executor ray: cluster to join [default: a local instance].")
]
MaxRetriesOption = Annotated[
    int | None, typer.Option(help="Retries of infrastructure failures [default: 2].")
]
StrictDivergenceOption = Annotated[
    bool, typer.Option(help="Abort if replay leaves the recorded rails (= --on-divergence strict).")
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
FaultsOption = Annotated[
    Path | None,
    typer.Option(
        help="Fault plan (YAML) the LLM proxy injects: status errors, latency, stalls, cuts, resets."
    ),
]
FaultSeedOption = Annotated[
    int | None, typer.Option(help="Seed of the fault plan's probability draws [default: the plan's seed].")
]
OnDivergenceOption = Annotated[
    DivergencePolicy | None,
    typer.Option(
        help="When a replayed request differs from the recording: warn (serve it anyway), strict "
        "(abort), cutover (go live) [default: warn].",
    ),
]

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def _divergence_policy(on_divergence: DivergencePolicy | None, strict_divergence: bool) -> DivergencePolicy:
    """``--on-divergence``, with ``--strict-divergence`` as the alias of ``--on-divergence strict``."""
    if strict_divergence and on_divergence not in (None, "strict"):
        raise typer.BadParameter(
            f"--strict-divergence conflicts with --on-divergence {on_divergence}",
            param_hint="--on-divergence",
        )
    return "strict" if strict_divergence else on_divergence or "warn"


def _faults(plan: Path | None, seed: int | None) -> FaultsUsed | None:
    """``--faults`` / ``--fault-seed``, checked: a bad plan is printed and exits with code 2."""
    if plan is None:
        if seed is not None:
            raise typer.BadParameter("--fault-seed needs --faults", param_hint="--fault-seed")
        return None
    try:
        return faults_used(plan, seed)
    except RerollError as exc:
        _refuse(exc)


def _runner(
    concurrency: int | None,
    max_starting: int | None,
    executor: str | None,
    ray_address: str | None,
    max_retries: int | None,
) -> RunnerOptions:
    """The runner flags (``continue-job``, ``branch``), checked: out of range exits with code 2."""
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


def _finish(outcome: RolloutOutcome) -> None:
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
    console.print(f"run folder: {outcome.run_dir}")
    if result.status == "error":
        raise typer.Exit(1)


def _refuse(exc: RerollError) -> NoReturn:
    """Print `exc` and exit: code 2 for bad input (a `ConfigError`, refused before anything is
    written), 1 for any other error of reroll's tree (e.g. Docker or Ray cannot be reached)."""
    err_console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2 if isinstance(exc, ConfigError) else 1) from None


def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; a `RerollError` is printed and exits (see `_refuse`)."""
    try:
        return _run(coro)
    except RerollError as exc:
        _refuse(exc)


@app.command()
def run(
    task: Annotated[
        Path | None,
        typer.Argument(
            help="Task folder (task.md, or task.toml + instruction.md) [default: the trial's task]."
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(help="Agent name; see `reroll agents` (with --trial: of the roles that name none)."),
    ] = None,
    trial: Annotated[
        Path | None,
        typer.Option(
            help="Trial file (YAML): scenes, roles, turns, User-driven rounds; see the README's Trials."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Live model: scripted, scripted:PATH, scripted-anthropic[:PATH], scripted-responses[:PATH], "
            "scripted-chat[:PATH], openai/NAME, openai-responses/NAME, anthropic/NAME, gemini/NAME, "
            "PROVIDER/NAME (with PROVIDER_BASE_URL)"
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Agent wall-clock budget in seconds [default: the task's].")
    ] = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    sandbox: SandboxOption = None,
    network: NetworkOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    image_map: ImageMapOption = None,
) -> None:
    """Record one rollout: run AGENT (or the trial's scenes) on TASK, record every LLM exchange, verify."""
    used = _faults(faults, fault_seed)
    try:
        _use_image_map(_parse_image_map(image_map or []))
        trial_config = load_trial(trial) if trial is not None else None
    except RerollError as exc:
        _refuse(exc)
    _finish(
        _guarded(
            run_task(
                task,
                agent_name=agent,
                model=model,
                trial=trial_config,
                options=RolloutOptions(
                    timeout_seconds=timeout, sandbox=sandbox, network=network, faults=used
                ),
                jobs_dir=jobs_dir,
                job_name=job_name,
                console=console,
            )
        )
    )


@app.command("continue")
def continue_(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to continue.")],
    at: AtOption = None,
    tasks_dir: TasksDirOption = None,
    model: Annotated[
        str | None, typer.Option(help="Live model after the cut [default: the original's].")
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(help="Agent that replays and continues the run [default: the recorded one]."),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Wall-clock budget in seconds [default: the original's].")
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Jobs dir for the new run [default: <orig-parent>/continued].")
    ] = None,
    require_timeout: Annotated[bool, typer.Option(help="Refuse runs whose status is not timeout.")] = False,
    on_divergence: OnDivergenceOption = None,
    strict_divergence: StrictDivergenceOption = False,
    replay_only: Annotated[
        bool, typer.Option(help="Rebuild via replay, stop at the cut point (no live model).")
    ] = False,
    sandbox: SandboxOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
) -> None:
    """Continue a run: replay its recorded exchanges (or the first K, --at K), then go live, then verify.

    Faults recorded in the run are reproduced where they happened; --faults injects new ones.
    Every timed-out run of a job: `reroll continue-job JOB_DIR`."""
    used = _faults(faults, fault_seed)
    options = RolloutOptions(
        timeout_seconds=timeout,
        sandbox=sandbox,
        faults=used,
        divergence_policy=_divergence_policy(on_divergence, strict_divergence),
    )
    _finish(
        _guarded(
            continue_run(
                run_folder,
                at=at,
                model=model,
                agent=agent,
                replay_only=replay_only,
                require_timeout=require_timeout,
                tasks_dir=tasks_dir,
                options=options,
                output=output,
                console=console,
            )
        )
    )


@app.command("continue-job")
def continue_job_(
    job_dir: Annotated[Path, typer.Argument(help="A job folder (or any folder of run folders).")],
    tasks_dir: TasksDirOption = None,
    model: Annotated[
        str | None, typer.Option(help="Live model after the cut [default: each original's].")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Wall-clock budget in seconds [default: each original's].")
    ] = None,
    on_divergence: OnDivergenceOption = None,
    strict_divergence: StrictDivergenceOption = False,
    sandbox: SandboxOption = None,
    concurrency: Annotated[int | None, typer.Option(help="Continuations at once [default: 4].")] = None,
    max_retries: MaxRetriesOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """Continue every timed-out run of a job: each replays its whole recording, then goes live.

    Writes JOB_DIR/continued/<run> and JOB_DIR/continued/summary.json, skipping runs done there.
    Exit 1 when a continuation ended in error."""
    from reroll.jobs.runner import continue_job

    options = RolloutOptions(
        timeout_seconds=timeout,
        sandbox=sandbox,
        divergence_policy=_divergence_policy(on_divergence, strict_divergence),
    )
    _job_guarded(
        continue_job(
            job_dir,
            console=console,
            model=model,
            tasks_dir=tasks_dir,
            options=options,
            runner=_runner(concurrency, max_starting, executor, ray_address, max_retries),
        )
    )


@app.command()
def replay(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to check.")],
    tasks_dir: TasksDirOption = None,
    timeout: Annotated[
        float | None, typer.Option(help="Wall-clock budget in seconds [default: the original's].")
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Jobs dir for the rebuilt run [default: <orig-parent>/replayed].")
    ] = None,
    sandbox: SandboxOption = None,
) -> None:
    """Fidelity check: rebuild a run by replay only and compare it with the original.

    Reports per step whether the request matched the recording, and whether the final workspace
    equals the original's. Exit 1 when not faithful.
    """
    report = _guarded(
        replay_run(
            run_folder,
            tasks_dir=tasks_dir,
            options=RolloutOptions(timeout_seconds=timeout, sandbox=sandbox),
            output=output,
            console=console,
        )
    )
    console.print(fidelity_report(report))
    if not report.faithful:
        raise typer.Exit(1)


@app.command()
def branch(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to branch.")],
    at: Annotated[
        str,
        typer.Option(
            help="Checkpoint: replay this many exchanges (0..N), a fraction of them (e.g. 0.5), or in a "
            "trial TURN:STEP (at a round boundary: TURN:0)."
        ),
    ],
    model: Annotated[
        list[str], typer.Option("--model", help="Live model of a group of branches; repeat for more models.")
    ],
    n: Annotated[int, typer.Option("-n", "--n", min=1, help="Branches per model.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Most branches running at once.")] = 4,
    max_retries: MaxRetriesOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
    tasks_dir: TasksDirOption = None,
    timeout: Annotated[
        float | None,
        typer.Option(help="Wall-clock budget of each branch, seconds [default: the original's]."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Where the tree goes [default: <orig-parent>/branched].")
    ] = None,
    on_divergence: OnDivergenceOption = None,
    sandbox: SandboxOption = None,
) -> None:
    """Branch a run: N continuations per model from checkpoint --at K, concurrently, each verified.

    Branches run like a job's rollouts (executor, start gate, retries of infrastructure
    failures). Prints each branch's reward and the mean reward per model (the value estimate of the
    checkpoint state). Exit 1 when a branch ended in error.
    """
    summary = _guarded(
        branch_run(
            run_folder,
            at=at,
            models=model,
            n=n,
            tasks_dir=tasks_dir,
            options=RolloutOptions(
                timeout_seconds=timeout,
                sandbox=sandbox,
                divergence_policy=_divergence_policy(on_divergence, strict_divergence=False),
            ),
            runner=_runner(concurrency, max_starting, executor, ray_address, max_retries),
            output=output,
            console=console,
        )
    )
    console.print(branch_report(summary))
    if any(child.status == "error" for child in summary.children):
        raise typer.Exit(1)


@app.command()
def job(
    job_file: Annotated[
        Path | None, typer.Argument(help="YAML job file (tasks, agents, models, repeats, ...).")
    ] = None,
    task: Annotated[list[Path] | None, typer.Option(help="Task folder (repeatable).")] = None,
    agent: Annotated[list[str] | None, typer.Option(help="Agent name (repeatable).")] = None,
    model: Annotated[list[str] | None, typer.Option(help="Model spec (repeatable).")] = None,
    repeats: Annotated[int | None, typer.Option(help="Rollouts per (task, agent, model).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Rollouts at once [default: 4].")] = None,
    max_retries: MaxRetriesOption = None,
    timeout: Annotated[
        float | None, typer.Option(help="Agent budget in seconds [default: the task's].")
    ] = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where job folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the job folder RESUME (its job.json); skips finished rollouts."),
    ] = None,
    sandbox: SandboxOption = None,
    network: NetworkOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
    image_map: ImageMapOption = None,
) -> None:
    """Run a job: every task x agent x model x repeat, at bounded concurrency, then a summary."""
    from reroll.jobs.jobfile import job_spec, load_job_file, load_saved_spec
    from reroll.jobs.runner import run_job

    try:
        mapped = _parse_image_map(image_map) if image_map else None
    except RerollError as exc:
        _refuse(exc)
    flags = {
        "image_map": mapped,
        "tasks": task,
        "agents": agent,
        "models": model,
        "repeats": repeats,
        "concurrency": concurrency,
        "max_retries": max_retries,
        "timeout_seconds": timeout,
        "name": job_name,
        "sandbox": sandbox,
        "network": network,
        "executor": executor,
        "max_starting": max_starting,
        "ray_address": ray_address,
    }
    overrides = {key: value for key, value in flags.items() if value is not None}
    if resume is not None and job_file is not None:
        err_console.print("[red]error:[/red] give a JOB_FILE or --resume JOB_DIR, not both")
        raise typer.Exit(2)
    try:
        if resume is not None:
            saved = load_saved_spec(resume).model_dump(mode="json")
            spec = job_spec({**saved, **overrides, "name": resume.name}, f"{resume}/job.json", resume)
            jobs_dir = resume.parent
        elif job_file is not None:
            spec = load_job_file(job_file, overrides)
        else:
            spec = job_spec(overrides, "the command line")
    except RerollError as exc:
        _refuse(exc)
    _use_image_map(spec.image_map)
    _job_guarded(run_job(spec, jobs_dir=jobs_dir, console=console))


def _parse_image_map(pairs: list[str]) -> dict[str, str]:
    """`reroll.sandbox.docker.images.parse_image_map`, imported late (it loads the docker SDK).

    Raises:
        ConfigError: an item is not SRC=DST.
    """
    from reroll.sandbox.docker.images import parse_image_map

    return parse_image_map(pairs)


def _use_image_map(image_map: dict[str, str]) -> None:
    """Hand `image_map` to the docker backend of this process (and the processes it starts) through
    ``$REROLL_IMAGE_MAP``; nothing when empty."""
    if image_map:
        os.environ["REROLL_IMAGE_MAP"] = ",".join(
            f"{source}={target}" for source, target in image_map.items()
        )


def _job_guarded(coro: Coroutine[Any, Any, JobSummary]) -> None:
    """Run a job; exit 2 on bad input, 1 if any rollout ended in error (or see `_refuse`), else 0."""
    try:
        summary = _run(coro)
    except RerollError as exc:
        _refuse(exc)
    counts = summary.totals.status_counts
    if counts.get("error", 0) + counts.get("unknown", 0):
        raise typer.Exit(1)


@app.command()
def agents() -> None:
    """List the built-in agents."""
    for spec in registry().values():
        console.print(f"[bold]{spec.name}[/bold]  ({spec.api_format})  {spec.description}")


@model_app.command("serve")
def model_serve(
    script: Annotated[Path, typer.Option(help="The script file (YAML or JSON turns).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
) -> None:
    """Serve the scripted model (OpenAI-compatible) until interrupted."""
    from reroll.models.scripted import serve

    try:
        asyncio.run(serve(script, host=host, port=port))
    except KeyboardInterrupt:
        pass
    except RerollError as exc:
        _refuse(exc)


@sandbox_app.command("prune")
def sandbox_prune(
    run_id: Annotated[
        str | None, typer.Option(help="Only this run's containers (its run folder's name), running or not.")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Also the containers of rollouts still running.")
    ] = False,
) -> None:
    """Remove leftover docker containers (their reroll process is gone), unused networks and their
    firewall tables (nftables ``inet reroll_*``; reroll's own only)."""
    from reroll.sandbox.docker.backend import prune

    try:
        removed = prune(run_id, running=all_)
    except RerollError as exc:
        _refuse(exc)
    console.print(f"removed {len(removed['containers'])} containers: {' '.join(removed['containers'])}")
    if removed["volumes"]:
        console.print(f"removed {len(removed['volumes'])} volumes: {' '.join(removed['volumes'])}")
    console.print(f"removed {len(removed['networks'])} networks: {' '.join(removed['networks'])}")
    if removed["firewall_tables"]:
        tables = " ".join(removed["firewall_tables"])
        console.print(f"removed {len(removed['firewall_tables'])} firewall tables (nftables): {tables}")
    if removed["kept"]:
        console.print(f"kept {len(removed['kept'])} containers of running rollouts (--all removes them too)")


@task_app.command("check")
def task_check(
    paths: Annotated[
        list[Path], typer.Argument(help="Task folders, or folders searched recursively for tasks.")
    ],
) -> None:
    """Load tasks and print each one's resolved configuration and the fields reroll ignores.

    Exit code 0 when every task loads, 2 when any does not (the reason is printed).
    """
    from reroll.tasks.check import check, render

    results = check(paths)
    render(results, console)
    failed = sum(result.task is None for result in results)
    console.print(f"\n{len(results) - failed} of {len(results)} tasks load")
    if failed:
        raise typer.Exit(2)


@app.command()
def export(
    path: Annotated[
        Path, typer.Argument(help="A run folder, a job folder or a branch tree (reroll branch's output).")
    ],
    format: Annotated[
        ExportFormat,
        typer.Option(
            "--format", help="atif (Harbor's ATIF v1.8 trajectory) or verifiers (RolloutOutput records)."
        ),
    ],
    output: Annotated[
        Path | None, typer.Option(help="File to write (replaced atomically) [default: standard output].")
    ] = None,
) -> None:
    """Export runs for trainers and viewers: ATIF trajectories or verifiers rollout records.

    A run gives one record; a job one per run folder in it (by name; not _attempts/ or
    continued/); a branch tree one per child, with the checkpoint's value estimate (the mean reward
    of the child's model). --format atif: one ATIF v1.8 JSON document for a run, JSON lines (one
    trajectory each) for a job or a tree; the replayed prefix of a continuation is marked
    is_copied_context. --format verifiers: JSON lines, one verifiers RolloutOutput per rollout
    (prompt, completion, reward, metrics, is_truncated, info). Exit 2 when PATH is not a run, job
    or tree, or a file in it is corrupt (the message names the file and the line).
    """
    from reroll.export import export_lines

    try:
        pieces = export_lines(path, format)
        if output is None:
            for piece in pieces:
                sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
        else:
            write_bytes_atomically(output, pieces)
    except RerollError as exc:
        _refuse(exc)
    if output is not None:
        err_console.print(f"exported {path} as {format} to {output}")


@app.command()
def view(
    path: Annotated[
        Path, typer.Argument(help="A run folder, a job folder or a branch tree (reroll branch's output).")
    ],
    output: Annotated[Path | None, typer.Option(help="Folder of the site [default: PATH/view].")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the site in the default browser.")] = False,
) -> None:
    """Write a static HTML site of a run, a job or a branch tree (no server, nothing fetched).

    A run: the conversation as the agent saw it (replayed and live steps, the cutover, each
    divergence with its field and diff, injected faults), the timeline of exchanges and of the
    agent's commands, the verifier's output and rewards, provenance links. A job: a table of its
    rollouts that sorts and filters, linking to each run. A branch tree: the tree, each branch's
    reward and the mean reward per model at the checkpoint. Exit 2 when PATH is not a run, job or
    tree, a file in it is corrupt (the message names the file), or the site cannot be written.
    """
    from reroll.view import build_site

    try:
        index = build_site(path, output, console=err_console)
    except RerollError as exc:
        _refuse(exc)
    console.print(f"site: {index}")
    if open_:
        import webbrowser

        webbrowser.open(index.as_uri())


def _version(value: bool) -> None:
    if value:
        console.print(f"reroll {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """reroll: run LLM agents in sandboxes, record every LLM exchange, replay and continue runs."""
    _show_image_builds()


def _show_image_builds() -> None:
    """Print the steps of image builds (minutes on first use of ``--sandbox docker``) on stderr."""
    images_logger = logging.getLogger("reroll.sandbox.docker.images")  # not imported: it loads the docker SDK
    if not images_logger.handlers:
        handler = logging.StreamHandler()  # stderr, one unwrapped line per step
        handler.setFormatter(logging.Formatter("%(asctime)s building images: %(message)s", "%H:%M:%S"))
        images_logger.addHandler(handler)
        images_logger.setLevel(logging.INFO)


def main() -> None:
    """Console-script entry point."""
    app()
