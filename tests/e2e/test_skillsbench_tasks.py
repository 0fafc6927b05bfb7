"""Real SkillsBench tasks, unmodified (``tests/fixtures/skillsbench``, whose README names the
source), run with the oracle agent on docker to reward 1.0, with no flag: ``FROM ubuntu:24.04`` is
built from reroll's catalogue (Debian bookworm stands in), the test script's ``pip install`` of
pytest and pytest-json-ctrf reaches PyPI through the host's CA bundle, and ``r2r-mpc-control``'s
``cpus = 4`` runs capped on a smaller host."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.cache import host_cpus
from reroll.runfolder.run import LIMITS_FILE

from tests.e2e.test_reward_hacks import run_oracle

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "skillsbench"


@pytest.mark.timeout(1800)  # a first run builds the catalogue image and apt- and pip-installs
@pytest.mark.parametrize(("task", "cpus"), [("r2r-mpc-control", 4), ("hvac-control", 2)])
def test_a_skillsbench_task_runs_unmodified_with_its_oracle_to_reward_1(
    tmp_path: Path, task: str, cpus: int
) -> None:
    result, run = run_oracle(FIXTURES / task, tmp_path, backend="docker", timeout_seconds=1700)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    if cpus > host_cpus():  # not Docker's "Range of CPUs is from 0.01 to N": capped, with a note
        note = f"asks for environment.cpus = {cpus} but this host has {host_cpus()}"
        assert note in (run / LIMITS_FILE).read_text()
    else:
        assert not (run / LIMITS_FILE).exists()
