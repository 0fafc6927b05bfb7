"""The ``reroll`` command line (typer).

Exit codes: 0 the rollout ran (status ``ok`` or ``timeout``); 1 it ended with status ``error``
(agent crash, strict divergence, verifier failure); 2 bad input (missing task, unknown agent,
corrupt run folder …), reported before anything is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from reroll import __version__
from reroll.agents import registry
from reroll.errors import RerollError
from reroll.resume import RolloutOutcome, continue_run, run_task

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


def _run(coro: Coroutine[Any, Any, RolloutOutcome]) -> RolloutOutcome:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


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


def _guarded(coro: Coroutine[Any, Any, RolloutOutcome]) -> None:
    try:
        outcome = _run(coro)
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    _finish(outcome)


@app.command()
def run(
    task: Annotated[Path, typer.Argument(help="Task folder (task.md, or task.toml + instruction.md).")],
    agent: Annotated[str, typer.Option(help="Agent name; see `reroll agents`.")],
    model: Annotated[
        str | None, typer.Option(help="Live model: scripted, scripted:PATH, openai/NAME.")
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Agent wall-clock budget in seconds [default: the task's].")
    ] = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    sandbox: SandboxOption = None,
) -> None:
    """Record one rollout: run AGENT on TASK, record every LLM exchange, verify."""
    _guarded(
        run_task(
            task,
            agent_name=agent,
            model=model,
            timeout_seconds=timeout,
            jobs_dir=jobs_dir,
            job_name=job_name,
            sandbox=sandbox or "local",
            console=console,
        )
    )


@app.command("continue")
def continue_(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to continue.")],
    tasks_dir: Annotated[
        Path | None, typer.Option(help="Folder holding the task [default: the recorded task_path].")
    ] = None,
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
    strict_divergence: Annotated[
        bool, typer.Option(help="Abort if replay leaves the recorded rails.")
    ] = False,
    replay_only: Annotated[
        bool, typer.Option(help="Rebuild via replay, stop at the cut point (no live model).")
    ] = False,
    sandbox: SandboxOption = None,
) -> None:
    """Continue a timed-out run: replay its recorded exchanges, then go live, then verify."""
    _guarded(
        continue_run(
            run_folder,
            tasks_dir=tasks_dir,
            model=model,
            timeout_seconds=timeout,
            output=output,
            require_timeout=require_timeout,
            divergence_policy="strict" if strict_divergence else "warn",
            replay_only=replay_only,
            sandbox=sandbox,
            console=console,
        )
    )


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
        str | None, typer.Option(help="Only this run's containers (its run folder's name).")
    ] = None,
) -> None:
    """Remove reroll's docker containers (running rollouts too) and its unused networks."""
    from reroll.sandbox.docker import prune

    try:
        removed = prune(run_id)
    except RerollError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"removed {len(removed['containers'])} containers: {' '.join(removed['containers'])}")
    console.print(f"removed {len(removed['networks'])} networks: {' '.join(removed['networks'])}")


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


def main() -> None:
    """Console-script entry point."""
    app()
