"""aider (aider-chat from PyPI, unmodified) end to end, once in the `local` sandbox and once in
`docker` (`tests.agents.e2e`).

aider speaks plain Chat Completions with its own few-shot examples first (the script counts only
its own answers: ``count: own``), edits by SEARCH/REPLACE blocks, makes the workspace a git
repository and asks for a commit message after each applied edit (the script's ``commit``
thread). The shared tampered-observation test tampers that side call's request (step 1: the
diff of calc.py aider committed first), which then matches no recorded thread. The install
(~690 MB, ~5 min) happens once per machine (agent cache) and per docker volume; the tests share
it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.agents.e2e import *  # noqa: F403 (the shared fixtures and tests)
from tests.agents.e2e import record_until_cut, served_in_order
from tests.e2e.test_main_job import read_json, trajectory

# The first test's set-up installs aider when the agent cache or docker volume lacks it (~5 min
# once, more on a loaded machine), beyond the suite's 300 s default.
AGENT = "aider"
pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def recorded(workdir: Path, sandbox_backend: str) -> Path:
    """Cut after turn 1 (a SEARCH block that fails to match) and its commit message side call."""
    return record_until_cut(workdir, sandbox_backend, AGENT, cut=2)


def test_the_recording_holds_the_failed_edit_and_its_commit_message(recorded: Path) -> None:
    assert read_json(recorded / "result.json")["counts"]["live"] == 2
    first, commit = trajectory(recorded)
    assert "SEARCH" in first["response"]["body"]["choices"][0]["message"]["content"]
    assert "commit message" in commit["request"]["body"]["messages"][0]["content"]
    assert commit["response"]["body"]["choices"][0]["message"]["content"].startswith("fix:")


def test_continue_finishes_with_reward_one(continued: Path) -> None:
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"].items() >= {"exchanges": 4, "replayed": 2, "live": 2, "divergences": 0}.items()
    assert ".git/HEAD" in read_json(continued / "workspace_manifest.json")  # aider committed


def test_replay_matches_every_step_and_the_workspace(  # type: ignore[no-redef]  # replaces the shared test
    replayed: dict[str, Any],
) -> None:
    assert len(replayed["steps"]) == 4 and replayed["rebuilt_rewards"] == {"reward": 1.0}
    # git's commits are the same (fixed identity and dates); only git's index may differ.
    assert set(replayed["workspace"]["volatile"]) <= {".git/index", ".aider.tags.cache.v4/cache.db"}


def test_the_replay_serves_every_recorded_step_in_order(  # type: ignore[no-redef]  # replaces the shared test
    replayed: dict[str, Any], continued: Path
) -> None:
    lines = served_in_order(continued, Path(replayed["rebuilt"]))
    assert lines[1]["response"]["body"] == trajectory(continued)[1]["response"]["body"]
