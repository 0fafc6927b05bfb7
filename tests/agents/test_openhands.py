"""OpenHands (the ``openhands`` CLI from PyPI, unmodified) end to end, once in the `local`
sandbox and once in `docker` (`tests.agents.e2e`).

OpenHands needs Python 3.12 exactly: the local sandbox uses the host's (pyenv's), docker a
relocatable copy of it uploaded once into the agents volume (`reroll.installs.python_runtime`),
since reroll's image has Debian bookworm's 3.11. It calls its own tools (``terminal``,
``finish``) over Chat Completions; its system prompt carries a datetime with microseconds and
every request a random ``prompt_cache_key`` (both declared volatile). The install (~750 MB)
happens once per machine (agent cache) and per docker volume; the module is skipped, saying
so, where the host has no Python 3.12.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.installs.python_runtime import host_python

from tests.agents.e2e import *  # noqa: F403 (the shared fixtures and tests)
from tests.agents.e2e import record_until_cut
from tests.e2e.test_main_job import read_json, trajectory

AGENT = "openhands"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.timeout(1800),  # the first set-up installs OpenHands (~200 packages)
    pytest.mark.skipif(
        host_python("3.12") is None,
        reason="OpenHands needs a Python 3.12 (pyenv's, or python3.12 on PATH): none here",
    ),
]


@pytest.fixture(scope="module")
def recorded(workdir: Path, sandbox_backend: str) -> Path:
    """Cut before turn 2 (OpenHands takes 20 to 60 s to start on a loaded machine: a step limit,
    not a timeout, cuts it)."""
    return record_until_cut(workdir, sandbox_backend, AGENT, cut=2)


def test_continue_finishes_with_reward_one(recorded: Path, continued: Path) -> None:
    assert read_json(recorded / "result.json")["counts"]["live"] == 2
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"].items() >= {"exchanges": 4, "replayed": 2, "live": 2, "divergences": 0}.items()
    tools = {tool["function"]["name"] for tool in trajectory(continued)[0]["request"]["body"]["tools"]}
    assert {"terminal", "finish"} <= tools
