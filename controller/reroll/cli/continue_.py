"""``reroll continue`` (one run) and ``reroll continue-job`` (every timed-out run of a job folder,
on the job runner `reroll.jobs.runner.Runner`): two commands, so each has only the flags it honours."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reroll.cli.common import (
    AtOption,
    ExecutorOption,
    MaxRetriesOption,
    MaxStartingOption,
    RayAddressOption,
    TasksDirOption,
    console,
    finish,
    guarded,
    job_guarded,
    runner_options,
)
from reroll.cli.flags import (
    FaultSeedOption,
    FaultsOption,
    ImageMapOption,
    MaxStepsOption,
    NetworkOption,
    OnDivergenceOption,
    SandboxConfigOption,
    SandboxOption,
    SkillsDirOption,
    SkillsOption,
    StrictDivergenceOption,
    TimeoutOption,
    TrustOption,
    UserModelOption,
    WithoutMcpOption,
    rollout_settings,
)


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
    timeout: TimeoutOption = None,
    max_steps: MaxStepsOption = None,
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
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    trust: TrustOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    skills: SkillsOption = None,
    skills_dir: SkillsDirOption = None,
    user_model: UserModelOption = None,
    without_mcp: WithoutMcpOption = None,
) -> None:
    """Continue a run: replay its recorded exchanges (or the first K, --at K), then go live, then verify.

    Faults recorded in the run are reproduced where they happened; --faults injects new ones.
    The sandbox, its settings (e.g. docker's image map) and the network are the original's
    unless given. Every timed-out run of a job: `reroll continue-job JOB_DIR`."""
    options = rollout_settings(locals())
    from reroll.rollout.commands.continue_ import continue_run

    finish(
        guarded(
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


def continue_job(
    job_dir: Annotated[Path, typer.Argument(help="A job folder (or any folder of run folders).")],
    tasks_dir: TasksDirOption = None,
    model: Annotated[
        str | None, typer.Option(help="Live model after the cut [default: each original's].")
    ] = None,
    timeout: TimeoutOption = None,
    max_steps: MaxStepsOption = None,
    on_divergence: OnDivergenceOption = None,
    strict_divergence: StrictDivergenceOption = False,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    trust: TrustOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    concurrency: Annotated[int | None, typer.Option(help="Continuations at once [default: 4].")] = None,
    max_retries: MaxRetriesOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
    user_model: UserModelOption = None,
) -> None:
    """Continue every timed-out run of a job: each replays its whole recording, then goes live.

    Writes JOB_DIR/continued/<run> and JOB_DIR/continued/summary.json, skipping runs done there.
    Each run's sandbox, settings and network are its own unless given; --user-model plays the
    persona User of the runs that have one. Exit 1 when a continuation ended in error."""
    options = rollout_settings(locals())
    from reroll.jobs.runner import continue_job as continue_job_run

    job_guarded(
        continue_job_run(
            job_dir,
            console=console,
            model=model,
            tasks_dir=tasks_dir,
            options=options,
            runner=runner_options(concurrency, max_starting, executor, ray_address, max_retries),
        )
    )
