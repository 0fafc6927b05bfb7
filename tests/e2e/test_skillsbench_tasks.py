"""A real SkillsBench task, unmodified (``tests/fixtures/skillsbench``, whose README names the
source), run with the oracle agent on docker to reward 1.0, with no flag: ``FROM ubuntu:24.04`` is
built from reroll's catalogue (Debian bookworm stands in) and the test script's ``pip install`` of
pytest and pytest-json-ctrf reaches PyPI through the host's CA bundle. A task asking for more CPUs
than the host has is capped with a note: ``tests/rollout/test_host_limits.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.runfolder.run import LIMITS_FILE

from tests.e2e.test_reward_hacks import run_oracle

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "skillsbench"


@pytest.mark.timeout(1800)  # a first run builds the catalogue image and apt- and pip-installs
def test_a_skillsbench_task_runs_unmodified_with_its_oracle_to_reward_1(tmp_path: Path) -> None:
    result, run = run_oracle(FIXTURES / "hvac-control", tmp_path, backend="docker", timeout_seconds=1700)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    assert not (run / LIMITS_FILE).exists()  # it asks for 2 CPUs, which every host here has
