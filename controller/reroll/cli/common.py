"""What the command modules of ``reroll`` share: the consoles, the options that several commands
take (one definition each, so their names and help read the same everywhere), and the helpers
that turn flags into options and errors into exit codes.

The flags of sandboxes are uniform: every command that starts sandboxes (``run``, ``continue``,
``continue-job``, ``replay``, ``branch``, ``job``) takes ``--sandbox``, ``--sandbox-config``,
``--image-map`` and ``--network``; the fault and divergence flags where they mean something (a
command that leaves one out says why in its help).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import orjson
import typer
from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, RerollError
from reroll_contracts.faults import FaultsUsed
from reroll_contracts.network import NetworkPolicy
from reroll_contracts.proxy import DivergencePolicy
from rich.console import Console

from reroll.host.llm_proxy import faults_used
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.start import RolloutOutcome
from reroll.runfolder.run import SIDE_LABELS
from reroll.sandbox.docker.config import parse_image_map
from reroll.trials.config import SkillMode

if TYPE_CHECKING:
    from reroll.runfolder.summary import JobSummary

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

SandboxOption = Annotated[
    str | None,
    typer.Option(
        help="Sandbox backend: local (isolated by namespaces), local-plain, docker, or a dotted path "
        "(package.module:Class)."
    ),
]
SandboxConfigOption = Annotated[
    str | None,
    typer.Option(
        help="Settings of the sandbox backend, a JSON object checked by the backend's config "
        "model, e.g. '{\"ready_timeout_seconds\": 120}' (see docs/sandboxes.md)."
    ),
]
NetworkOption = Annotated[
    NetworkPolicy | None,
    typer.Option(help="Egress: none (only the LLM proxy; local or docker) or full [default: the task's]."),
]
JudgeModelOption = Annotated[
    str | None,
    typer.Option(
        help="A judge's model (a --model spec) for a task scored by llm-judge or agent-judge "
        "[default: the task's]."
    ),
]
UserModelOption = Annotated[
    str | None,
    typer.Option(
        help="A persona User's model (a --model spec; a trial scene's `persona`) [default: the "
        "original's, else the persona's `model`]; recorded answers before a cut are replayed, not asked."
    ),
]
ImageMapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--image-map",
        help="Build a task's Dockerfile FROM a local image instead: SRC=DST, e.g. "
        "ubuntu:24.04=reroll/base:bookworm (repeatable; docker sandbox; no registry needed; "
        "= the docker setting image_map).",
    ),
]
SkillsOption = Annotated[
    SkillMode | None,
    typer.Option(
        "--skills",
        help="Skill mode: no-skill (the task's environment/skills hidden), with-skill (mounted at each "
        "agent's native skill paths), self-gen (a creator scene writes the skills the solver gets) "
        "[default: the original's, else the trial's, else no-skill]. "
        "$REROLL_SKILL_NUDGE=name|description|full also names them in the prompt.",
    ),
]
SkillsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--skills-dir",
        help="with-skill: mount this folder of <name>/SKILL.md instead of the task's environment/skills.",
    ),
]
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


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on uvloop when installed, else asyncio's loop."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def divergence_policy(on_divergence: DivergencePolicy | None, strict_divergence: bool) -> DivergencePolicy:
    """``--on-divergence``, with ``--strict-divergence`` as the alias of ``--on-divergence strict``.

    Raises:
        typer.BadParameter: both are given and disagree (exit 2).
    """
    if strict_divergence and on_divergence not in (None, "strict"):
        raise typer.BadParameter(
            f"--strict-divergence conflicts with --on-divergence {on_divergence}",
            param_hint="--on-divergence",
        )
    return "strict" if strict_divergence else on_divergence or "warn"


def faults_from_flags(plan: Path | None, seed: int | None) -> FaultsUsed | None:
    """``--faults`` / ``--fault-seed``, checked: a bad plan is printed and exits with code 2."""
    if plan is None:
        if seed is not None:
            raise typer.BadParameter("--fault-seed needs --faults", param_hint="--fault-seed")
        return None
    try:
        return faults_used(plan, seed)
    except RerollError as exc:
        refuse(exc)


def sandbox_settings(config: str | None, image_map: list[str] | None) -> dict[str, Any] | None:
    """``--sandbox-config`` and ``--image-map`` as the settings of the sandbox backend (checked
    later by the backend's config model); None when neither is given. Bad input is printed and
    exits with code 2 (not a JSON object; an image map item that is not ``SRC=DST``)."""
    settings: dict[str, Any] = {}
    if config is not None:
        try:
            settings = orjson.loads(config)
        except orjson.JSONDecodeError as exc:
            refuse(ConfigError(f"--sandbox-config: not JSON: {exc}"))
        if not isinstance(settings, dict):
            refuse(ConfigError(f"--sandbox-config: expected a JSON object, got {config!r}"))
    if image_map:
        try:
            settings["image_map"] = parse_image_map(image_map)
        except RerollError as exc:
            refuse(exc)
    return settings if config is not None or image_map else None


def runner_options(
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


def finish(outcome: RolloutOutcome) -> None:
    """Print how a rollout ended; exit 1 when its status is ``error``."""
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
