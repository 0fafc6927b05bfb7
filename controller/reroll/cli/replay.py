"""``reroll replay``: the fidelity check of a recorded run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reroll.cli.common import TasksDirOption, console, guarded
from reroll.cli.flags import (
    ImageMapOption,
    NetworkOption,
    SandboxConfigOption,
    SandboxOption,
    TimeoutOption,
    TrustOption,
    rollout_settings,
)


def replay(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to check.")],
    tasks_dir: TasksDirOption = None,
    timeout: TimeoutOption = None,
    output: Annotated[
        Path | None, typer.Option(help="Jobs dir for the rebuilt run [default: <orig-parent>/replayed].")
    ] = None,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    trust: TrustOption = None,
) -> None:
    """Fidelity check: rebuild a run by replay only and compare it with the original.

    Reports per step whether the request matched the recording, and whether the final workspace
    equals the original's. Exit 1 when not faithful. The sandbox, its settings and the network
    are the original's unless given. No --faults (faults recorded in the run are reproduced; new
    ones would make the rebuild differ). No --on-divergence: every step is served and
    compared, so the report names each divergence.
    """
    options = rollout_settings(locals())
    from reroll.cli.reports import fidelity_report
    from reroll.rollout.commands.replay import replay_run

    report = guarded(
        replay_run(
            run_folder,
            tasks_dir=tasks_dir,
            options=options,
            output=output,
            console=console,
        )
    )
    console.print(fidelity_report(report))
    if not report.faithful:
        raise typer.Exit(1)
