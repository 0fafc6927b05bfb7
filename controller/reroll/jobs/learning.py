"""Continual learning: a ``sequential-shared`` job's learner store, generation by generation.

A job with ``schedule: sequential-shared`` (`reroll.jobs.runner.run_job`) runs its rollouts in
plan order, one at a time, over the store in ``<job>/store`` (`reroll.runfolder.store`): each
rollout mounts the head generation g (`reroll.rollout.learner_store`), and the store as its
agent left it becomes generation g+1, with parent g, the rollout's name, status and rewards.
A rollout that failed before its store was read (its sandbox did not start) makes no generation;
the next one starts from g again. A retried attempt starts from g too.

Resume: a rollout completed by an earlier run of the job keeps its generation; one whose
generation was not recorded yet (the job was killed between the two) gets it recorded then.

The learner store is the one layer that does not roll back with a branch: ``reroll continue``
and ``reroll branch`` of a rollout of such a job mount the generation it started from and never
write the store back. ``reroll store rollback`` moves the head back; the next rollout starts there.
"""

from __future__ import annotations

from pathlib import Path

from reroll_contracts.datafile import read_data_file

from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import MAX_JSON_BYTES, RunConfig, StoreUse
from reroll.runfolder.store import (
    Generation,
    commit_generation,
    create_store,
    find_generation,
    load_head,
    store_of,
)
from reroll.runfolder.summary import RolloutSummary, read_result


def start_store(job_dir: Path, seed: Path | None) -> Path:
    """The job's store folder, created with generation 0 from `seed` unless it exists (resume).

    Raises:
        StoreError: `seed` is not a folder or holds what the store cannot take, or an existing
            store is corrupt.
    """
    store = store_of(job_dir)
    create_store(store, seed)
    return store


def next_use(store: Path) -> StoreUse:
    """The store use of the next rollout: the head generation, written back.

    Raises:
        StoreError: the head is missing or corrupt.
    """
    return StoreUse(path=str(store), generation=load_head(store).generation, writes_back=True)


def record_generation(store: Path, run_dir: Path, used: StoreUse) -> Generation | None:
    """Commit what the rollout in `run_dir` left in the store (result.json's ``learner_store``)
    as the next generation, with parent ``used.generation``; None when it left nothing (it failed
    before the store was read, or has no result.json).

    Raises:
        StoreError: the store is missing or corrupt, or a blob of the harvest is missing.
    """
    result = read_result(run_dir)
    if result is None or result.learner_store is None:
        return None
    return commit_generation(
        store,
        parent=used.generation,
        files=result.learner_store.files,
        rollout=run_dir.name,
        status=result.status,
        rewards=result.rewards,
    )


def resumed_generation(store: Path, run_dir: Path) -> Generation | None:
    """The generation of a rollout completed by an earlier run of the job: the recorded one, or
    recorded now from its result.json when it was not (`record_generation`).

    Raises:
        StoreError: as `record_generation`.
    """
    made = find_generation(store, run_dir.name)
    if made is not None:
        return made
    try:
        config = RunConfig.model_validate_json(read_data_file(RunPaths(run_dir).config, MAX_JSON_BYTES))
    except (OSError, ValueError):
        return None
    if config.learner_store is None:
        return None
    return record_generation(store, run_dir, config.learner_store)


def with_generations(summary: RolloutSummary, used: int | None, made: Generation | None) -> RolloutSummary:
    """`summary` with the generation its rollout started from and the one it made."""
    return summary.model_copy(
        update={"store_generation": used, "made_generation": made.number if made is not None else None}
    )
