"""``reroll branch``: N continuations per model from a checkpoint of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reroll.cli.common import (
    ExecutorOption,
    FaultSeedOption,
    FaultsOption,
    ImageMapOption,
    MaxRetriesOption,
    MaxStartingOption,
    NetworkOption,
    OnDivergenceOption,
    RayAddressOption,
    SandboxConfigOption,
    SandboxOption,
    SkillsDirOption,
    SkillsOption,
    StrictDivergenceOption,
    TasksDirOption,
    console,
    divergence_policy,
    faults_from_flags,
    guarded,
    runner_options,
    sandbox_settings,
)
from reroll.cli.reports import branch_report
from reroll.jobs.branch import branch as branch_run
from reroll.rollout.start import RolloutOptions


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
    strict_divergence: StrictDivergenceOption = False,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    skills: SkillsOption = None,
    skills_dir: SkillsDirOption = None,
) -> None:
    """Branch a run: N continuations per model from checkpoint --at K, concurrently, each verified.

    Branches run like a job's rollouts (executor, start gate, retries of infrastructure
    failures). Prints each branch's reward and the mean reward per model (the value estimate of the
    checkpoint state). The sandbox, its settings and the network are the original's unless
    given. Exit 1 when a branch ended in error.
    """
    options = RolloutOptions(
        timeout_seconds=timeout,
        sandbox=sandbox,
        sandbox_config=sandbox_settings(sandbox_config, image_map),
        network=network,
        faults=faults_from_flags(faults, fault_seed),
        divergence_policy=divergence_policy(on_divergence, strict_divergence),
        skill_mode=skills,
        skills_dir=skills_dir,
    )
    summary = guarded(
        branch_run(
            run_folder,
            at=at,
            models=model,
            n=n,
            tasks_dir=tasks_dir,
            options=options,
            runner=runner_options(concurrency, max_starting, executor, ray_address, max_retries),
            output=output,
            console=console,
        )
    )
    console.print(branch_report(summary))
    if any(child.status == "error" for child in summary.children):
        raise typer.Exit(1)
