"""``reroll rescore``: run a recorded run's verifier again, replaying its judge or with another."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reroll.cli.common import TasksDirOption, console, finish, guarded
from reroll.cli.flags import (
    ImageMapOption,
    JudgeModelOption,
    NetworkOption,
    SandboxConfigOption,
    SandboxOption,
    TrustOption,
    rollout_settings,
)


def rescore(
    run_folder: Annotated[Path, typer.Argument(help="The run folder to score again.")],
    judge_model: JudgeModelOption = None,
    tasks_dir: TasksDirOption = None,
    output: Annotated[
        Path | None, typer.Option(help="Jobs dir for the new run [default: <orig-parent>/rescored].")
    ] = None,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    image_map: ImageMapOption = None,
    network: NetworkOption = None,
    trust: TrustOption = None,
) -> None:
    """Score a run again: rebuild its workspace by replay, then run its verifier.

    An LLM or agent judge replays its recorded answers (the same reward, byte for byte; a request
    that differs from the recorded one is served and counted as a divergence), or asks
    --judge-model live. The new run folder's config.json says rescored_from. Exit 1 when the rebuild or the
    verifier failed.
    """
    options = rollout_settings(locals())
    from reroll.rollout.commands.rescore import rescore_run

    finish(
        guarded(
            rescore_run(
                run_folder,
                judge_model=judge_model,
                tasks_dir=tasks_dir,
                options=options,
                output=output,
                console=console,
            )
        )
    )
