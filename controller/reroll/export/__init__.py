"""``reroll export RUN|JOB|TREE --format FORMAT``: run folders for trainers and viewers.

What is exported (`sources`):

- a run folder (it has config.json): that run;
- a branch tree (`reroll.jobs.branch`: a parent folder with a summary.json listing ``children``):
  one entry per child, each with ``checkpoint`` (the cut, and the mean reward of the child's
  model there: the value estimate of the checkpoint state) in its verifiers ``info`` / its ATIF
  ``extra.reroll``;
- a job folder (it has job.json or a summary.json of rollouts, or run folders directly in it, as
  ``reroll run``'s job folders): every run folder directly in it, by name (``_attempts/`` and
  ``continued/`` are not).

Formats, by name in `reroll.export.formats.EXPORTERS` (an unknown name is an `ExportError`):
``atif`` (`reroll.export.atif`): one run gives one JSON document, a job or a tree one
trajectory per line (JSONL); ``verifiers`` (`reroll.export.verifiers`): one record per line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import ValidationError
from reroll_contracts.errors import ExportError

from reroll.export.formats import exporter
from reroll.runfolder.run import RunFolder, load_run_folder
from reroll.runfolder.summary import SUMMARY, BranchSummary

ExportFormat = str
"""The name of an export format: a key of `reroll.export.formats.EXPORTERS`."""
SourceKind = Literal["run", "job", "tree"]
_SKIPPED = frozenset({"_attempts", "continued"})


@dataclass
class Source:
    """One run folder to export, with what its container adds."""

    run: RunFolder
    example_id: int
    """The index of its task among the exported tasks."""
    extra: dict[str, Any]
    """Entries for verifiers' ``info`` / ATIF's ``extra.reroll`` (a branch's ``checkpoint``)."""


def kind_of(path: Path) -> SourceKind:
    """Whether `path` is a run folder, a job folder or a branch tree.

    Raises:
        ExportError: `path` is none of them (the message names it).
    """
    if branch_summary(path) is not None:
        return "tree"
    if (path / "config.json").is_file():
        return "run"
    if (path / "job.json").is_file() or (path / SUMMARY).is_file() or _run_folders_in(path):
        return "job"
    raise ExportError(
        f"{path}: not a run folder (no config.json), a job folder (no job.json, no run folder in it) "
        "or a branch tree"
    )


def sources(path: Path) -> Iterator[Source]:
    """The run folders under `path` (see the module docstring), loaded one at a time.

    Raises:
        ExportError: `path` is not a run, job or tree folder, or a job has no run folder.
        RunFolderError: a run folder is missing a file or one is corrupt (a trajectory line:
            `TrajectoryFormatError`, naming the file and the line).
    """
    path = path.resolve()
    kind = kind_of(path)
    if kind == "run":
        yield Source(load_run_folder(path), 0, {})
        return
    if kind == "tree":
        summary = branch_summary(path)
        assert summary is not None
        means = {model.model: model.mean_reward for model in summary.models}
        for child in summary.children:
            checkpoint = {
                "parent": summary.parent,
                "original": summary.original,
                "cut_index": summary.cut_index,
                "at": summary.at,
                "model": child.model,
                "branch_index": child.branch_index,
                "value_estimate": means.get(child.model),
            }
            yield Source(load_run_folder(path / child.folder), 0, {"checkpoint": checkpoint})
        return
    tasks: dict[str, int] = {}
    for folder in job_run_folders(path):
        run = load_run_folder(folder)
        task = run.config.task_name or run.config.task_path
        yield Source(run, tasks.setdefault(task, len(tasks)), {})


def job_run_folders(path: Path) -> list[Path]:
    """The run folders directly in the job folder `path`, by name (not ``_attempts/`` or ``continued/``).

    Raises:
        ExportError: there is none.
    """
    folders = _run_folders_in(path)
    if not folders:
        raise ExportError(f"{path}: a job folder without run folders")
    return folders


def _run_folders_in(path: Path) -> list[Path]:
    try:
        children = list(path.iterdir())
    except OSError:
        return []
    return sorted(
        p for p in children if p.is_dir() and p.name not in _SKIPPED and (p / "config.json").is_file()
    )


def export_lines(path: Path, fmt: str) -> Iterator[bytes]:
    """The export of `path` in the format `fmt` names (`reroll.export.formats.EXPORTERS`), as the
    bytes to write, one piece per run.

    One run in ``atif`` gives one indented JSON document; everything else JSON lines.

    Raises:
        ExportError: no format is called `fmt` (before anything is read), or as `sources`.
        RunFolderError: as `sources`, or a run that cannot be exported.
    """
    encoder = exporter(fmt)
    single = kind_of(path.resolve()) == "run"
    for source in sources(path):
        yield encoder.encode(source, single=single)


def branch_summary(path: Path) -> BranchSummary | None:
    """The branch tree's summary.json in `path`, or None when `path` is not a branch tree."""
    try:
        return BranchSummary.model_validate(orjson.loads((path / SUMMARY).read_bytes()))
    except (OSError, orjson.JSONDecodeError, ValidationError):
        return None
