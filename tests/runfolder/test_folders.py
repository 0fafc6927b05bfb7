"""What a folder is (a run, a job, a branch tree), the run folders of a job, the two summary.json
schemas, and the counts result.json carries for the job summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.runfolder.folders import job_run_folders, kind_of
from reroll.runfolder.run import RunResult, count_exchanges, load_manifest, load_run_folder
from reroll.runfolder.summary import (
    JOB_SUMMARY_FILE,
    TREE_SUMMARY_FILE,
    JobSummary,
    JobTotals,
    read_tree_summary,
    summarise_rollout,
)
from reroll_contracts.errors import RunFolderError

from tests.export.conftest import chat_exchanges, write_run, write_tree


def test_the_run_folders_of_a_job_leave_out_attempts_continuations_and_rebuilds(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for name in (
        "b__r1",
        "a__r1",
        "_attempts/a__r1.attempt1",
        "continued/b__r1",
        "replayed/a__r1",
        "branched/a__r1",
    ):
        write_run(job / name, chat_exchanges()[:1])
    # Folders that are named like the side folders but hold a config.json are left out too.
    for side in ("_attempts", "continued", "replayed", "branched"):
        (job / side / "config.json").write_text("{}")
    (job / "notes").mkdir()  # no config.json: not a run folder
    assert job_run_folders(job) == [job / "a__r1", job / "b__r1"]
    assert kind_of(job) == "job"
    assert job_run_folders(tmp_path / "missing") == []


def test_a_tree_is_told_from_a_run_and_from_a_job_by_its_summary(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree", [1.0, 0.0])
    assert (tree / "config.json").is_file()  # the shared prefix is a run folder...
    assert kind_of(tree) == "tree"  # ...and the folder reads as the tree
    summary = read_tree_summary(tree)
    assert summary is not None and [child.reward for child in summary.children] == [1.0, 0.0]
    assert kind_of(tree / summary.children[0].folder) == "run"

    job = tmp_path / "job"
    write_run(job / "t__r1", chat_exchanges()[:1])
    totals = JobTotals(rollouts=1, status_counts={"ok": 1}, reward_means={}, retries=0, exchanges=1, tokens=0)
    job_summary = JobSummary(
        job="job", path=str(job), started_at="s", finished_at="f", wall_seconds=1.0, totals=totals
    )
    (job / JOB_SUMMARY_FILE).write_text(job_summary.model_dump_json())
    assert JOB_SUMMARY_FILE == TREE_SUMMARY_FILE  # one name, two schemas:
    assert read_tree_summary(job) is None  # a job's summary is no tree's
    assert kind_of(job) == "job"

    with pytest.raises(RunFolderError, match=r"not a run folder \(no config.json\), a job folder"):
        kind_of(tmp_path / "empty")


def test_the_job_summary_takes_its_counts_from_result_json_and_counts_older_runs_itself(
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    counts = count_exchanges(load_run_folder(run).trajectory)
    assert counts.tokens is not None and counts.tokens > 0  # the recorded answers report usage
    result = json.loads((run / "result.json").read_text())

    result["counts"] = counts.model_dump() | {"exchanges": 99, "tokens": 7}
    (run / "result.json").write_text(json.dumps(result))
    summary = summarise_rollout(run, task="t", agent="a", model=None, attempts=1)
    assert (summary.exchanges, summary.tokens) == (99, 7)  # result.json's, the trajectory unread

    del result["counts"]["tokens"]  # a result.json of an earlier version
    (run / "result.json").write_text(json.dumps(result))
    assert RunResult.model_validate(result).counts.tokens is None
    summary = summarise_rollout(run, task="t", agent="a", model=None, attempts=1)
    assert (summary.exchanges, summary.tokens) == (counts.exchanges, counts.tokens)


def test_the_workspace_manifest_is_read_and_a_bad_one_named(tmp_path: Path) -> None:
    assert load_manifest(tmp_path) is None
    (tmp_path / "workspace_manifest.json").write_text('{"a.txt": "ab12", "link": "symlink:/etc"}')
    assert load_manifest(tmp_path) == {"a.txt": "ab12", "link": "symlink:/etc"}
    (tmp_path / "workspace_manifest.json").write_text('["a.txt"]')
    with pytest.raises(RunFolderError, match=r"workspace_manifest.json: expected a JSON object"):
        load_manifest(tmp_path)
