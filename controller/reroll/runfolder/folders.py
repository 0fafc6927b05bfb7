"""What a folder of runs is — a run folder, a job folder or a branch tree — and the run folders of a job.

::

    <job>/                          a job folder (`reroll job`, or `reroll run --job-name`)
      job.json                      the resolved job spec (`reroll.jobs.jobfile.JobSpec`)
      <rollout>/                    one run folder per rollout (`reroll.runfolder.run`)
      _attempts/                    failed attempts that were retried, or cut short
      continued/                    ``reroll continue-job``: the continuations, and their summary.json
      store/                        a ``sequential-shared`` job's learner store (`reroll.runfolder.store`)
      summary.json                  a `reroll.runfolder.summary.JobSummary`

    <tree>/                         a branch tree (`reroll branch`): the shared prefix is a run folder
      summary.json                  a `reroll.runfolder.summary.BranchSummary`
      <model>__<i>/                 one run folder per branch
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from reroll_contracts.errors import RunFolderError

from reroll.runfolder.run import CONFIG_FILE
from reroll.runfolder.summary import JOB_SUMMARY_FILE, read_tree_summary

JOB_SPEC_FILE = "job.json"
"""In a job folder: the resolved job spec (``reroll job --resume`` reads it)."""
ATTEMPTS_DIR = "_attempts"
"""In a job folder: the folders of failed attempts that were retried, or cut short."""
CONTINUED_DIR = "continued"
"""Beside a run folder: ``reroll continue``'s continuations (``reroll continue-job``'s, in a job folder)."""
REPLAYED_DIR = "replayed"
"""Beside a run folder: ``reroll replay``'s rebuilds."""
BRANCHED_DIR = "branched"
"""Beside a run folder: ``reroll branch``'s trees."""
FolderKind = Literal["run", "job", "tree"]


def kind_of(path: Path) -> FolderKind:
    """Whether `path` is a run folder, a job folder or a branch tree.

    A branch tree's parent folder is also a run folder (the shared prefix); it reads as a tree.

    Raises:
        RunFolderError: `path` is none of them (the message names it).
    """
    if read_tree_summary(path) is not None:
        return "tree"
    if (path / CONFIG_FILE).is_file():
        return "run"
    if (path / JOB_SPEC_FILE).is_file() or (path / JOB_SUMMARY_FILE).is_file() or job_run_folders(path):
        return "job"
    raise RunFolderError(
        f"{path}: not a run folder (no {CONFIG_FILE}), a job folder (no {JOB_SPEC_FILE}, no run folder "
        "in it) or a branch tree"
    )


def job_run_folders(job_dir: Path) -> list[Path]:
    """The run folders directly in `job_dir` (those with a config.json; not ``_attempts/``,
    ``continued/``, ``replayed/`` or ``branched/``), sorted by name; none when it holds none or
    cannot be listed."""
    try:
        children = list(job_dir.iterdir())
    except OSError:
        return []
    return sorted(
        child
        for child in children
        if child.name not in (ATTEMPTS_DIR, CONTINUED_DIR, REPLAYED_DIR, BRANCHED_DIR)
        and child.is_dir()
        and (child / CONFIG_FILE).is_file()
    )
