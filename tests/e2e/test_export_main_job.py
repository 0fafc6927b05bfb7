"""``reroll export`` of a real recorded run: mini-swe-agent from PyPI solving the bundled
fix-failing-test task with the bundled scripted model in the `local` sandbox, exported to ATIF
and to verifiers records by the real `reroll` executable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from atif import Trajectory
from reroll.export.verifiers import RolloutRecord

REROLL = str(Path(sys.executable).parent / "reroll")
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
pytestmark = [pytest.mark.slow, pytest.mark.spawns]


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=900)
    print(done.stdout, done.stderr, sep="\n")
    return done


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of mini-swe-agent that solves the task (reward 1)."""
    workdir = tmp_path_factory.mktemp("export-main-job")
    done = reroll(
        "run", str(TASK), "--agent", "mini-swe-agent", "--model", "scripted", "--timeout", "300",
        "--jobs-dir", "jobs", "--job-name", "record", "--sandbox", "local", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (folder,) = [p for p in (workdir / "jobs" / "record").iterdir() if p.is_dir()]
    return folder


def test_atif_export_of_a_recorded_run(recorded_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "trajectory.json"
    done = reroll("export", str(recorded_run), "--format", "atif", "--output", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trajectory = Trajectory.model_validate_json(out.read_bytes())
    exchanges = (recorded_run / "trajectory" / "llm_trajectory.jsonl").read_text().splitlines()
    agent_steps = [step for step in trajectory.steps if step.source == "agent"]
    assert len(agent_steps) == len(exchanges) >= 3
    assert trajectory.steps[0].source == "system"
    assert trajectory.agent.name == "mini-swe-agent"
    assert trajectory.extra is not None and trajectory.extra["reroll"]["rewards"] == {"reward": 1.0}
    assert all(step.metrics is not None for step in agent_steps)
    assert trajectory.final_metrics is not None and trajectory.final_metrics.total_steps == len(
        trajectory.steps
    )


def test_verifiers_export_of_a_recorded_run(recorded_run: Path, tmp_path: Path) -> None:
    done = reroll("export", str(recorded_run), "--format", "verifiers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    record = RolloutRecord.model_validate(json.loads(line))
    assert record.reward == 1.0 and not record.is_truncated
    assert [m["role"] for m in record.prompt] == ["system", "user"]
    assert record.completion[0]["role"] == "assistant"
    assert record.info["agent"] == "mini-swe-agent" and record.info["status"] == "ok"
