"""``reroll export``: runs as ATIF trajectories or verifiers rollout records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import err_console, refuse
from reroll.export.formats import EXPORTERS


def export(
    path: Annotated[
        Path, typer.Argument(help="A run folder, a job folder or a branch tree (reroll branch's output).")
    ],
    format: Annotated[
        str,
        typer.Option(
            "--format",
            help="; ".join(f"{name} ({exporter.summary})" for name, exporter in sorted(EXPORTERS.items())),
        ),
    ],
    output: Annotated[
        Path | None, typer.Option(help="File to write (replaced atomically) [default: standard output].")
    ] = None,
) -> None:
    """Export runs for trainers and viewers: ATIF trajectories or verifiers rollout records.

    A run gives one record; a job one per run folder in it (by name; not _attempts/ or
    continued/); a branch tree one per child, with the checkpoint's value estimate (the mean reward
    of the child's model). --format atif: one ATIF v1.8 JSON document for a run, JSON lines (one
    trajectory each) for a job or a tree; the replayed prefix of a continuation is marked
    is_copied_context. --format verifiers: JSON lines, one verifiers RolloutOutput per rollout
    (prompt, completion, reward, metrics, is_truncated, info). Exit 2 when the format is unknown,
    PATH is not a run, job or tree, or a file in it is corrupt (the message names the file and the line).
    """
    from reroll.export import export_lines
    from reroll.runfolder.run import write_bytes_atomically

    try:
        pieces = export_lines(path, format)
        if output is None:
            for piece in pieces:
                sys.stdout.buffer.write(piece)
            sys.stdout.buffer.flush()
        else:
            write_bytes_atomically(output, pieces)
    except RerollError as exc:
        refuse(exc)
    if output is not None:
        err_console.print(f"exported {path} as {format} to {output}")
