"""A slice of the public corpus (issue 29), kept byte for byte in ``tests/fixtures/`` (the READMEs
there name the source commit), run with the oracle agent and no flag: each task scores what it
scores under its own harness, on docker and (two of them) on the default ``local`` sandbox, which
runs on the task's image; each stands for one semantic reroll must share with Harbor:

- ``largest-eigenval`` (Terminal-Bench 2): ``test.sh`` runs from the image's ``WORKDIR`` (the tests
  import ``eigen`` from ``/app``); ``FROM python:3.13-slim-bookworm`` gets a catalogue stand-in;
- ``kv-store-grpc`` (Terminal-Bench 2): the server the reference solution leaves running is still
  running when the verifier's tests connect to it;
- ``sales-pivot-analysis`` (SkillsBench): the image's ``ENV PATH`` (a venv holding pandas) holds in
  the oracle and verifier phases;
- ``regex-log`` (Terminal-Bench 2): its verifier downloads ``uv`` from astral.sh, which this machine
  cannot reach: the rollout is an ``error`` naming the host, never ``ok`` with reward 0.

``hvac-control`` runs in `tests.e2e.test_skillsbench_tasks`. The whole corpus is a benchmark
(``scripts/conformance/run``, ``docs/conformance.md``), not a test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_reward_hacks import run_oracle

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.timeout(1200)  # a first run builds the task's image and pip-installs its packages
@pytest.mark.parametrize(
    ("task", "backend"),
    [
        ("terminal-bench-2/largest-eigenval", "docker"),
        ("terminal-bench-2/kv-store-grpc", "docker"),
        ("skillsbench/sales-pivot-analysis", "docker"),
        # the default sandbox on the task's image (`reroll.sandbox.local.imagefs`), built as docker's
        ("terminal-bench-2/largest-eigenval", "local"),
        ("terminal-bench-2/kv-store-grpc", "local"),
    ],
)
def test_a_public_task_reaches_its_oracle_reward(task: str, backend: str, tmp_path: Path) -> None:
    result, _ = run_oracle(FIXTURES / task, tmp_path, backend=backend, timeout_seconds=1100)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result


@pytest.mark.timeout(900)
def test_a_verifier_that_needs_the_internet_is_an_error_naming_the_host(tmp_path: Path) -> None:
    result, _ = run_oracle(FIXTURES / "terminal-bench-2" / "regex-log", tmp_path, backend="docker")
    assert result["status"] == "error" and result["rewards"] is None, result
    assert "astral.sh" in result["error"], result["error"]
