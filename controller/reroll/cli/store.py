"""``reroll store log|diff|rollback``: a ``sequential-shared`` job's learner store
(`reroll.runfolder.store`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import console, refuse

JobArgument = Annotated[Path, typer.Argument(help="The job folder (run with --schedule sequential-shared).")]


def store_log(job_dir: JobArgument) -> None:
    """List the store's generations: parent, rollout, status, reward, files, what changed; and the rollbacks.

    Exit 2 when JOB has no learner store or a file of it is corrupt (the message names it).
    """
    from reroll.jobs.report import print_generations
    from reroll.runfolder.store import load_head, store_of, summarise_store

    try:
        generations = summarise_store(store_of(job_dir))
        head = load_head(store_of(job_dir))
    except RerollError as exc:
        refuse(exc)
    print_generations(generations, console)
    for rollback in head.rollbacks:
        console.print(
            f"rollback {rollback.at}: generation {rollback.from_generation} → {rollback.to_generation}"
        )
    console.print(f"head: generation {head.generation} (the next rollout starts from it)")


def store_diff(
    job_dir: JobArgument,
    generation: Annotated[int, typer.Argument(help="A generation (compared with its parent, or with GEN2).")],
    generation2: Annotated[
        int | None, typer.Argument(metavar="[GEN2]", help="A second generation: show GENERATION → GEN2.")
    ] = None,
) -> None:
    """Show what changed in the store: from GENERATION's parent to GENERATION, or from GENERATION
    to GEN2, as a unified diff.

    Exit 2 when JOB has no learner store, a generation does not exist or a file is corrupt.
    """
    from reroll.runfolder.store import load_generation, store_of, unified_diff

    store = store_of(job_dir)
    try:
        if generation2 is None:
            new = load_generation(store, generation)
            old = load_generation(store, new.parent) if new.parent is not None else None
        else:
            old, new = load_generation(store, generation), load_generation(store, generation2)
        lines = unified_diff(store, old, new)
    except RerollError as exc:
        refuse(exc)
    for line in lines:
        console.print(line.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
    if not lines:
        console.print("no change")


def store_rollback(
    job_dir: JobArgument,
    generation: Annotated[int, typer.Argument(help="The generation the next rollout starts from.")],
) -> None:
    """Move the store's head back to GENERATION: the job's next rollout (reroll job --resume JOB)
    starts from it. Nothing is deleted; the rollback is recorded in JOB/store/head.json.

    Exit 2 when JOB has no learner store, or no such generation.
    """
    from reroll.runfolder.store import rollback_store, store_of

    try:
        head = rollback_store(store_of(job_dir), generation)
    except RerollError as exc:
        refuse(exc)
    moved = head.rollbacks[-1]
    console.print(
        f"head: generation {moved.to_generation} (was {moved.from_generation}); "
        "the next rollout starts from it"
    )
