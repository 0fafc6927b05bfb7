"""OpenHands (the ``openhands`` CLI from PyPI, unmodified) end to end in the `local` sandbox
(`tests.agents.e2e`); not in `docker`: it needs Python 3.12 and reroll's image has Debian
bookworm's 3.11.

OpenHands calls its own tools (``terminal``, ``finish``) over Chat Completions; its system prompt
carries a datetime with microseconds and every request a random ``prompt_cache_key`` (both
declared volatile). The install (~750 MB) happens once per machine, with a python3.12 from PATH
or pyenv; the module is skipped, saying so, where there is none.
"""

from __future__ import annotations

import glob
import shutil
from pathlib import Path

import pytest

from tests.agents.e2e import continue_live, record_until_stalled, replay_report, strict_rebuild
from tests.test_main_job import read_json, trajectory

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.timeout(1800),  # the first set-up installs OpenHands (~200 packages)
    pytest.mark.skipif(
        not (shutil.which("python3.12") or glob.glob("/root/.pyenv/versions/3.12.*/bin/python3.12")),
        reason="OpenHands needs a Python 3.12 (python3.12 on PATH, or pyenv's): none here",
    ),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("openhands-local")


@pytest.fixture(scope="module")
def recorded(workdir: Path) -> Path:
    """Cut before turn 2; 120 s: OpenHands takes 20 to 60 s to start on a loaded machine."""
    return record_until_stalled(workdir, "local", "openhands", stall_turn=2, timeout_seconds=120)


@pytest.fixture(scope="module")
def continued(recorded: Path, workdir: Path) -> Path:
    return continue_live(recorded, workdir)


def test_continue_finishes_with_reward_one(recorded: Path, continued: Path) -> None:
    assert read_json(recorded / "result.json")["counts"]["live"] == 2
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"] == {"exchanges": 4, "replayed": 2, "live": 2, "divergences": 0}
    tools = {tool["function"]["name"] for tool in trajectory(continued)[0]["request"]["body"]["tools"]}
    assert {"terminal", "finish"} <= tools


def test_replay_matches_every_step_and_the_workspace(continued: Path, workdir: Path) -> None:
    assert len(replay_report(continued, workdir)["steps"]) == 4


def test_a_strict_replay_only_rebuild_replays_every_step(continued: Path, workdir: Path) -> None:
    strict_rebuild(continued, workdir)
