"""``reroll export RUN|JOB|TREE --format FORMAT``: run folders for trainers and viewers.

What is exported (`sources`; which folder is what: `reroll.runfolder.folders.kind_of`):

- a run folder (it has config.json): that run;
- a branch tree (`reroll.jobs.branch`: a parent folder with a summary.json listing ``children``):
  one entry per child, each with ``checkpoint`` (the child's cut, the prompt or answer it was
  given there, the mean reward of the child's model there: the value estimate of the checkpoint
  state, and ``value_curve``: ``[{at, cut_index, mean_reward}]`` per branch point of the tree,
  the value along the run) in its verifiers ``info`` / its ATIF ``extra.reroll``;
- every run that asked ask_user questions: ``asks`` (its asks.json records: question, options,
  answer, who answered, step and place) in the same place;
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
from typing import Any

from reroll_contracts.errors import ExportError

from reroll.export.formats import exporter
from reroll.runfolder.asks import load_asks
from reroll.runfolder.folders import job_run_folders, kind_of
from reroll.runfolder.run import RunFolder, load_run_folder
from reroll.runfolder.summary import read_tree_summary

ExportFormat = str
"""The name of an export format: a key of `reroll.export.formats.EXPORTERS`."""


@dataclass
class Source:
    """One run folder to export, with what its container adds."""

    run: RunFolder
    example_id: int
    """The index of its task among the exported tasks."""
    extra: dict[str, Any]
    """Entries for verifiers' ``info`` / ATIF's ``extra.reroll`` (a branch's ``checkpoint``)."""


def sources(path: Path) -> Iterator[Source]:
    """The run folders under `path` (see the module docstring), loaded one at a time.

    Raises:
        ExportError: a job folder holds no run folder.
        RunFolderError: `path` is not a run, job or tree folder, or a run folder is missing a file
            or one is corrupt (a trajectory line: `TrajectoryFormatError`, naming the file and the line).
    """
    path = path.resolve()
    kind = kind_of(path)
    if kind == "run":
        yield _source(path, 0, {})
        return
    if kind == "tree":
        summary = read_tree_summary(path)
        assert summary is not None
        points = summary.branch_points
        curve = [
            {"at": point.at, "cut_index": point.cut_index, "mean_reward": point.mean_reward}
            for point in points
        ]
        for child in summary.children:
            point = points[child.point]
            checkpoint = {
                "parent": summary.parent,
                "original": summary.original,
                "cut_index": point.cut_index,
                "at": point.at,
                "prompt": point.prompt,
                "answer": point.answer,
                "model": child.model,
                "branch_index": child.branch_index,
                "value_estimate": summary.value_estimate(child),
                "value_curve": curve,
            }
            yield _source(path / child.folder, 0, {"checkpoint": checkpoint})
        return
    tasks: dict[str, int] = {}
    folders = job_run_folders(path)
    if not folders:
        raise ExportError(f"{path}: a job folder without run folders")
    for folder in folders:
        source = _source(folder, 0, {})
        task = source.run.config.task_name or source.run.config.task_path
        source.example_id = tasks.setdefault(task, len(tasks))
        yield source


def _source(folder: Path, example_id: int, extra: dict[str, Any]) -> Source:
    """The run folder `folder` loaded, with its ask_user questions and answers (``asks``) in the
    extra entries when it has any.

    Raises:
        RunFolderError: the folder is missing a file, or one is corrupt (asks.json included).
    """
    asks = load_asks(folder)
    if asks:
        extra = extra | {"asks": [ask.model_dump(mode="json") for ask in asks]}
    return Source(load_run_folder(folder, sides=True), example_id, extra)


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
