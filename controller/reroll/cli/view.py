"""``reroll view``: a static HTML site of a run, a job or a branch tree."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import console, err_console, refuse


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
        refuse(exc)
    console.print(f"site: {index}")
    if open_:
        import webbrowser

        webbrowser.open(index.as_uri())
