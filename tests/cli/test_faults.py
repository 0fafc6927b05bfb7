"""`--faults` on the real `reroll` executable: a bad plan is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_errors import reroll

pytestmark = pytest.mark.spawns  # every test runs the reroll CLI as a subprocess


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("rules: [{fault: {kind: status, status_code: 429}, at: 1}]", "Extra inputs are not permitted"),
        ("rules: [{fault: {kind: teleport}}]", "does not match any of the expected tags"),
        ("rules: [", "not YAML"),
    ],
)
def test_bad_plan_is_refused_naming_the_file(tmp_path: Path, examples: Path, text: str, cause: str) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    args = ["--agent", "mini-swe-agent", "--model", "scripted", "--jobs-dir", "jobs", "--faults", str(plan)]
    done = reroll("run", str(examples / "hello-file"), *args, cwd=tmp_path)
    assert done.returncode == 2
    assert str(plan) in done.stderr and cause in done.stderr
    assert not (tmp_path / "jobs").exists()


def test_missing_plan_and_seed_without_plan(tmp_path: Path, examples: Path) -> None:
    base = ["run", str(examples / "hello-file"), "--agent", "oracle", "--jobs-dir", "jobs"]
    done = reroll(*base, "--faults", "nope.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "nope.yaml: cannot read the fault plan" in done.stderr
    done = reroll(*base, "--fault-seed", "3", cwd=tmp_path)
    assert done.returncode == 2 and "--fault-seed needs --faults" in done.stderr
    assert not (tmp_path / "jobs").exists()


def test_seed_and_plan_recorded_in_config(tmp_path: Path, examples: Path) -> None:
    plan = Path(__file__).resolve().parents[2] / "examples" / "faults" / "chaos.yaml"
    base = ["run", str(examples / "hello-file"), "--agent", "oracle", "--jobs-dir", "jobs", "--job-name", "j"]
    done = reroll(*base, "--faults", str(plan), "--fault-seed", "42", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (config,) = (tmp_path / "jobs" / "j").glob("*/config.json")
    assert json.loads(config.read_text())["faults"] == {"plan_path": str(plan), "seed": 42}


def test_a_jobs_fault_plan_and_backend_settings_are_recorded_in_each_runs_config(
    tmp_path: Path, examples: Path
) -> None:
    plan = Path(__file__).resolve().parents[2] / "examples" / "faults" / "chaos.yaml"
    done = reroll(
        "job", "--task", str(examples / "hello-file"), "--agent", "oracle", "--jobs-dir", "jobs",
        "--job-name", "j", "--sandbox", "local-plain", "--sandbox-config", '{"ready_timeout_seconds": 45}',
        "--faults", str(plan), "--fault-seed", "7", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (config,) = (tmp_path / "jobs" / "j").glob("*/config.json")
    recorded = json.loads(config.read_text())
    assert recorded["faults"] == {"plan_path": str(plan), "seed": 7}
    assert recorded["sandbox_config"] == {"ready_timeout_seconds": 45.0}
    job = json.loads((tmp_path / "jobs" / "j" / "job.json").read_text())
    assert job["faults"] == str(plan) and job["sandbox_config"] == {"ready_timeout_seconds": 45}
