"""`pytest_report.judge`: pytest's own report, trusted over the test script's exit status."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from reroll_sidecar import pytest_report

PASSED = '<testsuites><testsuite name="pytest" tests="3" failures="0" errors="0" skipped="1"/></testsuites>'
FAILED = '<testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" skipped="0"/></testsuites>'


def leave(folder: Path, started: bool, report: str | None) -> str:
    """Write what a pytest run leaves in a report folder; returns the folder's path."""
    if report is not None:
        (folder / pytest_report.REPORT_NAME).write_text(report)
        os.utime(folder / pytest_report.REPORT_NAME, ns=(10**18, 10**18))
    if started:
        (folder / pytest_report.STARTED_NAME).write_text("")
        os.utime(folder / pytest_report.STARTED_NAME, ns=(10**18 - 1, 10**18 - 1))
    return str(folder)


@pytest.mark.parametrize(
    ("started", "report", "ceiling", "note"),
    [
        (False, None, 1.0, ""),
        (True, PASSED, 1.0, "pytest's report: 3 tests, 0 failures, 0 errors, 1 skipped"),
        (
            True,
            FAILED,
            2 / 3,
            r"pytest's report: 3 tests, 1 failures, 0 errors, 0 skipped; rewards zeroed above 0\.6667,",
        ),
        (True, None, 0.0, "pytest started but wrote no report"),
        (True, "<testsuites><testsuite", 0.0, "pytest's report .* is unreadable"),
        (True, '<testsuite tests="x"/>', 0.0, "pytest's report .* is unreadable"),
        (True, '<testsuite tests="0" errors="1"/>', 0.0, "pytest's report: 0 tests, 0 failures, 1 errors"),
    ],
)
def test_judge_caps_the_rewards_at_what_pytest_reported(
    tmp_path: Path, started: bool, report: str | None, ceiling: float, note: str
) -> None:
    judgement = pytest_report.judge(leave(tmp_path, started, report))
    assert judgement.ceiling == pytest.approx(ceiling)
    assert re.match(note, judgement.note), judgement.note


def test_a_score_based_reward_is_kept_and_a_forged_full_mark_zeroed(tmp_path: Path) -> None:
    """Harbor's score-based test.sh writes the share of tests passed and ignores pytest's exit
    status: kept (issue 29, defect 8). A script that turned a forged exit status 0 into 1.0
    although a test failed: zeroed."""
    judgement = pytest_report.judge(leave(tmp_path, started=True, report=FAILED))
    assert judgement.capped(2 / 3) == pytest.approx(2 / 3) and judgement.capped(0.5) == 0.5
    assert judgement.capped(1.0) == 0.0
    clean = pytest_report.judge(leave(tmp_path, started=True, report=PASSED))
    assert clean.capped(2.0) == 2.0  # a count in reward.json, such as cases_passed


def test_a_report_older_than_the_last_start_is_the_previous_pytest_s(tmp_path: Path) -> None:
    folder = leave(tmp_path, started=True, report=PASSED)
    os.utime(tmp_path / pytest_report.STARTED_NAME, ns=(10**18 + 1, 10**18 + 1))  # a second pytest died
    assert pytest_report.judge(folder).ceiling == 0.0


def test_the_report_folder_is_private_and_removed(tmp_path: Path) -> None:
    with pytest_report.ReportFolder() as folder:
        assert os.stat(folder.path).st_mode & 0o777 == 0o700
        assert f"--junitxml={folder.path}/junit.xml" in folder.addopts()
    assert not os.path.exists(folder.path)
