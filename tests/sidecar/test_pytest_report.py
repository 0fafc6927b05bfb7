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
    ("started", "report", "zeroed", "note"),
    [
        (False, None, False, ""),
        (True, PASSED, False, "pytest's report: 3 tests, 0 failures, 0 errors, 1 skipped"),
        (True, FAILED, True, "pytest's report: 3 tests, 1 failures, 0 errors, 0 skipped; rewards zeroed"),
        (True, None, True, "pytest started but wrote no report"),
        (True, "<testsuites><testsuite", True, "pytest's report .* is unreadable"),
        (True, '<testsuite tests="x"/>', True, "pytest's report .* is unreadable"),
    ],
)
def test_judge_zeroes_the_rewards_unless_pytest_reported_a_clean_run(
    tmp_path: Path, started: bool, report: str | None, zeroed: bool, note: str
) -> None:
    judgement = pytest_report.judge(leave(tmp_path, started, report))
    assert judgement.zero_rewards is zeroed
    assert re.match(note, judgement.note), judgement.note


def test_a_report_older_than_the_last_start_is_the_previous_pytest_s(tmp_path: Path) -> None:
    folder = leave(tmp_path, started=True, report=PASSED)
    os.utime(tmp_path / pytest_report.STARTED_NAME, ns=(10**18 + 1, 10**18 + 1))  # a second pytest died
    assert pytest_report.judge(folder).zero_rewards


def test_the_report_folder_is_private_and_removed(tmp_path: Path) -> None:
    with pytest_report.ReportFolder() as folder:
        assert os.stat(folder.path).st_mode & 0o777 == 0o700
        assert f"--junitxml={folder.path}/junit.xml" in folder.addopts()
    assert not os.path.exists(folder.path)
