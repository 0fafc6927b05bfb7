"""pytest's own report, trusted over the test script's exit status (``Hardening.pytest_report``).

A test script usually turns pytest's exit status into the reward. Code of the workspace runs
inside that pytest, so it can end the process with status 0 before any test fails
(``os._exit(0)`` at import, or from an ``atexit`` hook once the tests failed). With this check,
every pytest the script starts (under the hardened ``PYTEST_ADDOPTS``) also writes

- ``started.log``: pytest's log file, created when pytest configures itself (before it collects,
  so before it imports the code under test) — the proof that pytest ran;
- ``junit.xml``: its JUnit report, written only when the session finishes;

into a fresh folder only root can enter (`ReportFolder`). `judge` then reads them: a pytest that
started and wrote no report zeroes every reward; a report that counts failures or errors caps the
rewards at the share of tests that passed (`Judgement.ceiling`): a reward above it is zeroed. So a
script that turns pytest's exit status into 1.0 after an exit-status forge scores 0, while a
score-based script (its reward the share of tests passed, or less: Harbor's tasks that ignore the
exit status) keeps the reward it wrote, as under Harbor (issue 29, defect 8).

Residual risk (documented in docs/security.md): code under test runs in the same process as pytest
and may forge the report (the folder's name is in ``PYTEST_ADDOPTS``); a script that runs its
tests without pytest, or pytest with its own ``--junitxml`` or ``--log-file``, is judged by its
exit status alone (the last case: the task turns ``pytest_report`` off); a ``conftest.py`` that
imports the code under test runs it before pytest's log file exists.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass

REPORT_NAME = "junit.xml"
STARTED_NAME = "started.log"
MAX_REPORT_BYTES = 64 * 1024 * 1024
"""A larger report is not read (the rewards are zeroed)."""


@dataclass(frozen=True)
class Judgement:
    """What `judge` found."""

    note: str
    """pytest's counts, or why the rewards are zeroed; empty when pytest did not run."""
    ceiling: float = 1.0
    """The highest reward pytest's report supports: 1.0 (a clean run, or no pytest), the share of
    the tests it ran that passed (failures or errors), 0.0 (no report). A reward above it is
    zeroed (`capped`)."""

    def capped(self, reward: float) -> float:
        """`reward`, or 0.0 when it is above a `ceiling` below 1.0 (a clean report caps nothing:
        a reward.json's counts, such as ``cases_passed: 2``, stay)."""
        return reward if self.ceiling >= 1.0 or reward <= self.ceiling + 1e-9 else 0.0


class ReportFolder:
    """A fresh folder (mode 0700, the sidecar's user) where pytest writes its report, in `parent`
    (the sidecar's state folder: not ``/tmp``, which a verify sees as an overlay of its own,
    `reroll_sidecar.verify_ns`), else the temporary folder; removed on exit.

    Attributes:
        path: the folder's absolute path.
    """

    def __init__(self, parent: str | None = None) -> None:
        self.path = tempfile.mkdtemp(prefix="reroll-pytest-report-", dir=parent)

    def addopts(self) -> str:
        """The options added to ``PYTEST_ADDOPTS`` (the log file gets nothing but its creation)."""
        return (
            f" --junitxml={self.path}/{REPORT_NAME}"
            f" --log-file={self.path}/{STARTED_NAME} --log-file-level=CRITICAL"
        )

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def judge(folder: str) -> Judgement:
    """Read the report pytest left in `folder` (a `ReportFolder`'s path)."""
    report = os.path.join(folder, REPORT_NAME)
    if not os.path.exists(os.path.join(folder, STARTED_NAME)):  # pytest never ran
        return Judgement("")
    started = os.stat(os.path.join(folder, STARTED_NAME)).st_mtime_ns
    if not os.path.exists(report) or os.stat(report).st_mtime_ns < started:  # the last pytest's is missing
        return Judgement(
            "pytest started but wrote no report: it ended before its session finished "
            "(e.g. os._exit or a crash while importing or running the code under test); rewards zeroed",
            ceiling=0.0,
        )
    try:
        counts = _counts(report)
    except (OSError, ValueError, ElementTree.ParseError) as exc:
        return Judgement(f"pytest's report {report} is unreadable ({exc}); rewards zeroed", ceiling=0.0)
    summary = ", ".join(f"{value} {key}" for key, value in counts.items())
    if counts["failures"] or counts["errors"]:
        ran = max(counts["tests"] - counts["skipped"], counts["failures"] + counts["errors"])
        share = (ran - counts["failures"] - counts["errors"]) / ran
        return Judgement(
            f"pytest's report: {summary}; rewards zeroed above {share:.4g}, the share of tests that passed",
            ceiling=share,
        )
    return Judgement(f"pytest's report: {summary}")


def _counts(report: str) -> dict[str, int]:
    """The tests, failures, errors and skipped counts summed over the report's ``<testsuite>`` elements.

    Raises:
        OSError: unreadable. ValueError: too large, or a count that is not a number.
        xml.etree.ElementTree.ParseError: not XML.
    """
    with open(report, "rb") as handle:
        content = handle.read(MAX_REPORT_BYTES + 1)
    if len(content) > MAX_REPORT_BYTES:
        raise ValueError(f"larger than {MAX_REPORT_BYTES} bytes")
    root = ElementTree.fromstring(content)
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, "0"))
    return counts
