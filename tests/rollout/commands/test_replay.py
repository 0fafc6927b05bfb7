"""The fidelity report from a rebuilt run's files (no replay run): per-step verdicts from its
trajectory, and the workspace comparison."""

from __future__ import annotations

import json
from pathlib import Path

from reroll.rollout.commands.replay import _compare_workspaces, _step_reports
from reroll.runfolder.run import TRAJECTORY


def test_an_attempt_superseded_by_its_retry_is_retried_not_missing(tmp_path: Path) -> None:
    lines = [
        {
            "request": {"timestamp": "t", "path": "/v1/chat/completions", "body": {}},
            "response": {"timestamp": "t", "status_code": 200, "body": {}},
            "metadata": {"step": step, "source": "replayed", "replayed_from": served},
        }
        for step, served in enumerate([1, 2])
    ]
    path = tmp_path / TRAJECTORY
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    reports = _step_reports(tmp_path, 4, retried={0})
    assert [r.verdict for r in reports] == ["retried", "match", "match", "missing"]


def test_a_volatile_file_that_differs_is_reported_but_not_a_change() -> None:
    original = {"calc.py": "a", ".git/index": "i1", ".aider.tags.cache.v4/cache.db": "c1", "gone": "x"}
    rebuilt = {"calc.py": "b", ".git/index": "i2", ".aider.tags.cache.v4/cache.db": "c2", "new": "y"}
    report = _compare_workspaces(original, rebuilt, [".git/index", ".aider.tags.cache.v4/*"])
    assert report is not None and not report.equal
    assert report.changed == ["calc.py"]
    assert report.volatile == [".aider.tags.cache.v4/cache.db", ".git/index"]
    assert (report.missing, report.extra) == (["gone"], ["new"])


def test_only_volatile_differences_leave_the_workspaces_equal() -> None:
    report = _compare_workspaces({".git/index": "i1"}, {".git/index": "i2"}, [".git/index"])
    assert report is not None and report.equal and report.volatile == [".git/index"]
    assert not _compare_workspaces({".git/index": "i1"}, {".git/index": "i2"}).equal  # type: ignore[union-attr]
