"""The ``reroll`` command line (typer).

Exit codes: 0 the rollout ran (status ``ok`` or ``timeout``); 1 it ended with status ``error``
(agent crash, strict divergence, verifier failure) — for ``replay``: the rebuild is not
faithful; for ``branch``: a branch ended in error; 2 bad input (missing task, unknown agent,
corrupt run folder, ``--at`` out of range …), reported before anything is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from reroll import __version__
from reroll.agents import registry
from reroll.branching import branch as branch_run
from reroll.errors import RerollError
from reroll.fidelity import replay_run
from reroll.llm_proxy import DivergencePolicy, faults_used
from reroll.reports import branch_report, fidelity_report
from reroll.resume import RolloutOutcome, continue_run, run_task
from reroll.runfolder import FaultsUsed
from reroll.tasks import NetworkPolicy

if TYPE_CHECKING:
    from reroll.jobreport import JobSummary


app = typer.Typer(
    help="reroll: run LLM agents in sandboxes, record every LLM exchange, replay and continue runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="The bundled scripted model server.", no_args_is_help=True)
app.add_typer(model_app, name="model")
sandbox_app = typer.Typer(help="Sandbox housekeeping.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

SandboxOption = Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")]
NetworkOption = Annotated[
    NetworkPolicy | None,
    typer.Option(help="Egress: none (only the LLM proxy; needs docker) or full [default: the task's]."),
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
TasksDirOption = Annotated[
    Path | None, typer.Option(help="Folder holding the task [default: the recorded task_path].")
]
AtOption = Annotated[
    str | None,
    typer.Option(help="Checkpoint: replay this many exchanges (0..N), or a fraction of them (e.g. 0.5)."),
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
        err_console.print(f"[red]error:[/red] {exc}")
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


def _guarded(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; bad input (a `RerollError`) is printed and exits with code 2."""
    try:
        return _run(coro)
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@app.command()
def run(
    task: Annotated[Path, typer.Argument(help="Task folder (task.md, or task.toml + instruction.md).")],
    agent: Annotated[str, typer.Option(help="Agent name; see `reroll agents`.")],
    model: Annotated[
        str | None,
        typer.Option(
            help="Live model: scripted, scripted:PATH, scripted-anthropic[:PATH], scripted-responses[:PATH], "
            "openai/NAME, openai-responses/NAME, anthropic/NAME"
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
) -> None:
    """Record one rollout: run AGENT on TASK, record every LLM exchange, verify."""
    used = _faults(faults, fault_seed)
    _finish(
        _guarded(
            run_task(
                task,
                agent_name=agent,
                model=model,
                timeout_seconds=timeout,
                jobs_dir=jobs_dir,
                job_name=job_name,
                sandbox=sandbox or "local",
                network=network,
                console=console,
                faults=used,
            )
        )
    )


@app.command("continue")
def continue_(
    run_folder: Annotated[
        Path, typer.Argument(help="The run folder to continue (with --all: a job folder).")
    ],
    at: AtOption = None,
    tasks_dir: TasksDirOption = None,
    model: Annotated[
        str | None, typer.Option(help="Live model after the cut [default: the original's].")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Wall-clock budget in seconds [default: the original's].")
    ] = None,
    output: Annotated[
        Path | None, typer.Option(help="Jobs dir for the new run [default: <orig-parent>/continued].")
    ] = None,
    require_timeout: Annotated[bool, typer.Option(help="Refuse runs whose status is not timeout.")] = False,
    on_divergence: OnDivergenceOption = None,
    strict_divergence: Annotated[
        bool, typer.Option(help="Abort if replay leaves the recorded rails (= --on-divergence strict).")
    ] = False,
    replay_only: Annotated[
        bool, typer.Option(help="Rebuild via replay, stop at the cut point (no live model).")
    ] = False,
    sandbox: SandboxOption = None,
    all_runs: Annotated[
        bool, typer.Option("--all", help="RUN_FOLDER is a job folder: continue each of its timed-out runs.")
    ] = False,
    concurrency: Annotated[int, typer.Option(help="With --all: continuations at once.")] = 4,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
) -> None:
    """Continue a run: replay its recorded exchanges (or the first K, --at K), then go live, then verify.

    Faults recorded in the run are reproduced where they happened; --faults injects new ones."""
    used = _faults(faults, fault_seed)
    if all_runs:
        from reroll.jobfile import DEFAULT_MAX_STARTING
        from reroll.jobs import continue_job

        if output is not None or replay_only or at is not None or used is not None:
            err_console.print(
                "[red]error:[/red] --all continues into JOB_DIR/continued; "
                "no --output, --replay-only, --at, --faults"
            )
            raise typer.Exit(2)
        _job_guarded(
            continue_job(
                run_folder,
                concurrency=concurrency,
                console=console,
                model=model,
                timeout_seconds=timeout,
                tasks_dir=tasks_dir,
                sandbox=sandbox,
                divergence_policy=_divergence_policy(on_divergence, strict_divergence),
                executor=executor or "asyncio",
                max_starting=DEFAULT_MAX_STARTING if max_starting is None else max_starting,
                ray_address=ray_address,
            )
        )
        return
    _finish(
        _guarded(
            continue_run(
                run_folder,
                at=at,
                tasks_dir=tasks_dir,
                model=model,
                timeout_seconds=timeout,
                output=output,
                require_timeout=require_timeout,
                divergence_policy=_divergence_policy(on_divergence, strict_divergence),
                replay_only=replay_only,
                sandbox=sandbox,
                console=console,
                faults=used,
            )
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
            output=output,
            timeout_seconds=timeout,
            sandbox=sandbox,
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
        typer.Option(help="Checkpoint: replay this many exchanges (0..N), or a fraction of them (e.g. 0.5)."),
    ],
    model: Annotated[
        list[str], typer.Option("--model", help="Live model of a group of branches; repeat for more models.")
    ],
    n: Annotated[int, typer.Option("-n", "--n", min=1, help="Branches per model.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Most branches running at once.")] = 4,
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

    Prints each branch's reward and the mean reward per model (the value estimate of the
    checkpoint state). Exit 1 when a branch ended in error.
    """
    summary = _guarded(
        branch_run(
            run_folder,
            at=at,
            models=model,
            n=n,
            concurrency=concurrency,
            tasks_dir=tasks_dir,
            timeout_seconds=timeout,
            output=output,
            divergence_policy=_divergence_policy(on_divergence, strict_divergence=False),
            sandbox=sandbox,
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
    max_retries: Annotated[
        int | None, typer.Option(help="Retries of infrastructure failures [default: 2].")
    ] = None,
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
) -> None:
    """Run a job: every task x agent x model x repeat, at bounded concurrency, then a summary."""
    from reroll.jobfile import job_spec, load_job_file, load_saved_spec
    from reroll.jobs import run_job

    flags = {
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
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    _job_guarded(run_job(spec, jobs_dir=jobs_dir, console=console))


def _job_guarded(coro: Coroutine[Any, Any, JobSummary]) -> None:
    """Run a job; exit 2 on bad input, 1 if any rollout ended in error, else 0."""
    try:
        summary = _run(coro)
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
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
    from reroll.scripted_model import serve

    try:
        asyncio.run(serve(script, host=host, port=port))
    except KeyboardInterrupt:
        pass
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@sandbox_app.command("prune")
def sandbox_prune(
    run_id: Annotated[
        str | None, typer.Option(help="Only this run's containers (its run folder's name), running or not.")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Also the containers of rollouts still running.")
    ] = False,
) -> None:
    """Remove leftover docker containers (their reroll process is gone) and unused networks."""
    from reroll.sandbox.docker import prune

    try:
        removed = prune(run_id, running=all_)
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"removed {len(removed['containers'])} containers: {' '.join(removed['containers'])}")
    console.print(f"removed {len(removed['networks'])} networks: {' '.join(removed['networks'])}")
    if removed["kept"]:
        console.print(f"kept {len(removed['kept'])} containers of running rollouts (--all removes them too)")


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
    images_logger = logging.getLogger("reroll.sandbox.images")  # not imported: it loads the docker SDK
    if not images_logger.handlers:
        handler = logging.StreamHandler()  # stderr, one unwrapped line per step
        handler.setFormatter(logging.Formatter("%(asctime)s building images: %(message)s", "%H:%M:%S"))
        images_logger.addHandler(handler)
        images_logger.setLevel(logging.INFO)


def main() -> None:
    """Console-script entry point."""
    app()
