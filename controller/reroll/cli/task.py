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
