"""The controller's limit of open files (`reroll.host.open_files`): the soft limit is raised to
the hard one, and a concurrency the hard limit cannot hold is refused with a message naming it.
Each case runs in a child Python whose limits it lowers first (a lowered hard limit is for good)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from reroll.host.open_files import FILES_BASE, FILES_PER_ROLLOUT

pytestmark = pytest.mark.spawns


def _in_child(soft: int, hard: int, body: str) -> subprocess.CompletedProcess[str]:
    code = f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
    return subprocess.run(
        [sys.executable, "-c", code + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    done = _in_child(
        64,
        4096,
        """
        from reroll.host.open_files import open_files_for
        print(open_files_for(16), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4096", "4096"]


def test_a_job_the_hard_limit_cannot_hold_is_refused_before_it_starts_naming_the_limit() -> None:
    hard = FILES_BASE + FILES_PER_ROLLOUT * 100
    done = _in_child(
        64,
        hard,
        """
        from reroll.jobs.executors import create_executor
        from reroll.jobs.jobfile import RunnerOptions
        from reroll_contracts.errors import JobError
        create_executor(RunnerOptions(concurrency=100))
        print("100 fit")
        try:
            create_executor(RunnerOptions(concurrency=256))
        except JobError as exc:
            print(exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    fits, refusal = done.stdout.splitlines()
    assert fits == "100 fit"
    assert "256 rollouts at once need about" in refusal
    assert f"limit of open files (RLIMIT_NOFILE, ulimit -n) is {hard}" in refusal
    assert "run at most 100 at once (--concurrency)" in refusal
