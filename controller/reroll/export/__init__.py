"""``reroll export RUN|JOB|TREE --format atif|verifiers``: run folders for trainers and viewers.

What is exported (`sources`; which folder is what: `reroll.runfolder.folders.kind_of`):

- a run folder (it has config.json): that run;
- a branch tree (`reroll.jobs.branch`: a parent folder with a summary.json listing ``children``):
  one entry per child, each with ``checkpoint`` (the cut, and the mean reward of the child's
  model there: the value estimate of the checkpoint state) in its verifiers ``info`` / its ATIF
  ``extra.reroll``;
- a job folder (it has job.json or a summary.json of rollouts, or run folders directly in it, as
  ``reroll run``'s job folders): every run folder directly in it, by name (``_attempts/`` and
  ``continued/`` are not).

Formats: ``atif`` (`reroll.export.atif`): one run gives one JSON document, a job or a tree one
trajectory per line (JSONL); ``verifiers`` (`reroll.export.verifiers`): one record per line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from reroll_contracts.errors import ExportError

from reroll.runfolder.folders import job_run_folders, kind_of
from reroll.runfolder.run import RunFolder, load_run_folder
from reroll.runfolder.summary import read_tree_summary

ExportFormat = Literal["atif", "verifiers"]


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
        yield Source(load_run_folder(path), 0, {})
        return
    if kind == "tree":
        summary = read_tree_summary(path)
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
    folders = job_run_folders(path)
    if not folders:
        raise ExportError(f"{path}: a job folder without run folders")
    for folder in folders:
        run = load_run_folder(folder)
        task = run.config.task_name or run.config.task_path
        yield Source(run, tasks.setdefault(task, len(tasks)), {})


def export_lines(path: Path, fmt: ExportFormat) -> Iterator[bytes]:
    """The export of `path` in `fmt`, as the bytes to write, one piece per run.

    One run in ``atif`` gives one indented JSON document; everything else JSON lines.

    Raises:
        ExportError, RunFolderError: as `sources`, or a run that cannot be exported.
    """
    from reroll.export.atif import run_to_atif
    from reroll.export.verifiers import run_to_record

    single = kind_of(path.resolve()) == "run"
    for source in sources(path):
        if fmt == "atif":
            trajectory = run_to_atif(source.run)
            if source.extra and trajectory.extra is not None:
                trajectory.extra["reroll"] |= source.extra
            data = trajectory.to_json_dict()
            yield orjson.dumps(data, option=orjson.OPT_INDENT_2 if single else 0) + b"\n"
        else:
            try:
                record = run_to_record(source.run, example_id=source.example_id, info=source.extra)
            except KeyError as exc:
                raise ExportError(f"{source.run.path}: {exc.args[0]}") from exc
            yield orjson.dumps(record.model_dump(mode="json")) + b"\n"
