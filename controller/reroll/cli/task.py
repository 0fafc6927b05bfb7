"""``reroll task check``: load task folders and show what reroll makes of them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reroll.cli.common import console


def task_check(
    paths: Annotated[
        list[Path], typer.Argument(help="Task folders, or folders searched recursively for tasks.")
    ],
) -> None:
    """Load tasks as `reroll run` loads them and print each one's resolved configuration, the
    fields reroll ignores, and warnings: a base image with no stand-in here, a task that needs its
    image where the default `local` sandbox cannot build it (no Docker), a judge model a run here
    would refuse (a missing key: set it, or pass --judge-model).

    Exit code 0 when every task loads (warnings or not), 2 when any does not (the reason is printed).
    """
    from reroll.rollout.mcp import optional_warnings
    from reroll.rollout.sandbox_spec import sandbox_spec
    from reroll.rollout.start import load_runnable_task
    from reroll.rollout.verify.judge_model import judge_model_warnings
    from reroll.sandbox.docker.images import base_warnings, local_images
    from reroll.sandbox.local.imagebuild import local_warnings, no_builder
    from reroll.tasks.check import check, render

    is_local = local_images()
    unreachable = no_builder()
    results = check(
        paths,
        load_runnable_task,
        advise=lambda task: [
            *local_warnings(sandbox_spec(task), unreachable),
            *base_warnings(sandbox_spec(task), is_local),
            *judge_model_warnings(task),
            *optional_warnings(task.spec.environment.mcp_servers),
        ],
    )
    render(results, console)
    failed = sum(result.task is None for result in results)
    warned = sum(bool(result.warnings) for result in results)
    with_warnings = f"; {warned} with warnings" if warned else ""
    console.print(f"\n{len(results) - failed} of {len(results)} tasks load{with_warnings}")
    if failed:
        raise typer.Exit(2)
