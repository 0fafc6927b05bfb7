"""The end-to-end flow every real agent's test module runs (one module per agent, once per
sandbox): record until the timeout → ``reroll continue`` to reward 1.0 → ``reroll replay``
matches every step with the same workspace → a strict replay-only rebuild replays every step."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.test_main_job import only_folder, read_json, reroll, trajectory

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"


def record_until_stalled(
    workdir: Path, sandbox: str, agent: str, stall_turn: int, timeout_seconds: float
) -> Path:
    """Record `agent` on the task with its own script, whose turn `stall_turn` never comes in
    time: the run ends by its timeout. Returns the run folder."""
    script = yaml.safe_load((TASK / f"scripted-model.{agent}.yaml").read_text())
    script["turns"][stall_turn]["delay_seconds"] = 3600
    stalling = workdir / f"stall-at-turn-{stall_turn}.yaml"
    stalling.write_text(yaml.safe_dump(script))
    done = reroll(
        "run", str(TASK), "--agent", agent, "--model", f"scripted:{stalling}",
        "--timeout", str(timeout_seconds), "--jobs-dir", "jobs", "--job-name", "record",
        "--sandbox", sandbox, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = only_folder(workdir / "jobs" / "record")
    assert read_json(recorded / "result.json")["status"] == "timeout"
    return recorded


def continue_live(recorded: Path, workdir: Path) -> Path:
    """``reroll continue`` with the task's own script for the agent; returns the new run folder."""
    done = reroll("continue", str(recorded), "--model", "scripted", "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return only_folder(recorded.parent / "continued")


def replay_report(continued: Path, workdir: Path) -> dict:
    """``reroll replay`` of `continued`: its fidelity.json, after checking the verdict is faithful."""
    done = reroll("replay", str(continued), "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    report = read_json(only_folder(continued.parent / "replayed") / "fidelity.json")
    assert report["faithful"] and report["workspace"]["equal"], report
    assert {step["verdict"] for step in report["steps"]} == {"match"}
    return report


def strict_rebuild(continued: Path, workdir: Path) -> list[dict]:
    """A replay-only rebuild of `continued` with ``--on-divergence strict``: every recorded step
    is replayed, in order, without a divergence. Returns the rebuilt trajectory."""
    done = reroll(
        "continue", str(continued), "--replay-only", "--on-divergence", "strict", "--timeout", "300",
        "--output", "strict", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rebuilt = only_folder(workdir / "strict")
    recorded = len(trajectory(continued))
    result = read_json(rebuilt / "result.json")
    assert result["counts"] == {"exchanges": recorded, "replayed": recorded, "live": 0, "divergences": 0}
    lines = trajectory(rebuilt)
    assert [line["metadata"]["replayed_from"] for line in lines] == list(range(recorded))
    return lines
