"""Checkpoints end to end with real parts (mini-swe-agent, local sandbox, proxy, scripted model):
``continue --at K`` with a model swap, ``--at 0.5`` through the Python API, ``reroll replay``
on a clean and a tampered run, and ``reroll branch`` with two models.

One finished run is recorded once per module, with the task's script minus its delays (so it
finishes in seconds); every test starts from it. The second model is
examples/tasks/fix-failing-test/scripted-model-wrong-fix.yaml, whose fix fails the verifier.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import reroll
import yaml
from reroll.runfolder.paths import RunPaths

from tests.conftest import EXAMPLES
from tests.e2e.test_main_job import read_json, trajectory
from tests.e2e.test_main_job import reroll as reroll_cli

pytestmark = pytest.mark.slow
TASK = EXAMPLES / "fix-failing-test"
WRONG_FIX = f"scripted:{TASK / 'scripted-model-wrong-fix.yaml'}"


def sources(folder: Path) -> list[str]:
    return [line["metadata"]["source"] for line in trajectory(folder)]


def only_run(jobs: Path) -> Path:
    (folder,) = [p for p in jobs.iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def fast_model(workdir: Path) -> str:
    """The task's own script without its delays, as a model spec."""
    script = yaml.safe_load((TASK / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn.pop("delay_seconds", None)
    path = workdir / "fast.yaml"
    path.write_text(yaml.safe_dump(script))
    return f"scripted:{path}"


@pytest.fixture(scope="module")
def ok_run(workdir: Path, fast_model: str) -> Path:
    """A recorded run that fixed the bug and finished (status ok) in five exchanges."""
    done = reroll_cli(
        "run", str(TASK), "--agent", "mini-swe-agent", "--model", fast_model, "--timeout", "120",
        "--jobs-dir", "jobs", "--job-name", "record", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = only_run(workdir / "jobs" / "record")
    result = read_json(folder / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert len(trajectory(folder)) == 5
    return folder


def test_continue_at_a_step_swaps_the_model_of_a_finished_run(ok_run: Path, workdir: Path) -> None:
    done = reroll_cli(
        "continue", str(ok_run), "--at", "2", "--model", WRONG_FIX, "--output", "swap", cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    assert "cut at 2 (--at 2)" in done.stdout
    continued = only_run(workdir / "swap")
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 0.0}
    assert sources(continued) == ["replayed", "replayed", "live", "live"]
    original = trajectory(ok_run)
    lines = trajectory(continued)
    assert [line["response"]["body"] for line in lines[:2]] == [
        line["response"]["body"] for line in original[:2]
    ]
    assert "len(values) - 1" in json.dumps(lines[2]["response"]["body"])
    config = read_json(continued / "config.json")
    assert config["model"] == WRONG_FIX
    provenance = config["continued_from"]
    assert provenance["path"] == str(ok_run) and provenance["status"] == "ok"
    assert (provenance["cut_index"], provenance["at"]) == (2, "2")
    assert provenance["live_model"] == WRONG_FIX != provenance["original_model"]


async def test_continue_at_a_fraction_through_the_python_api(ok_run: Path, workdir: Path) -> None:
    outcome = await reroll.continue_run(ok_run, at=0.5, output=workdir / "fraction")
    assert outcome.result.status == "ok" and outcome.result.rewards == {"reward": 1.0}
    assert sources(outcome.run_dir) == ["replayed", "replayed", "live", "live", "live"]
    provenance = read_json(outcome.run_dir / "config.json")["continued_from"]
    assert (provenance["cut_index"], provenance["at"]) == (2, "0.5")  # floor(0.5 * 5)


def test_continue_at_out_of_range_writes_nothing(ok_run: Path, workdir: Path) -> None:
    done = reroll_cli("continue", str(ok_run), "--at", "6", "--output", "out-of-range", cwd=workdir)
    assert done.returncode == 2
    assert "--at 6 is out of range: the run has 5 recorded exchanges" in done.stderr
    assert not (workdir / "out-of-range").exists()


def test_replay_of_a_clean_run_is_faithful(ok_run: Path, workdir: Path) -> None:
    done = reroll_cli("replay", str(ok_run), "--output", "replay-clean", cwd=workdir)
    assert done.returncode == 0, done.stdout
    assert "requests matched: 5/5" in done.stdout and "verdict: faithful" in done.stdout
    report = read_json(only_run(workdir / "replay-clean") / "fidelity.json")
    assert report["faithful"] is True
    assert [step["verdict"] for step in report["steps"]] == ["match"] * 5
    assert report["workspace"]["equal"] is True and report["workspace"]["files"] >= 2
    assert report["rebuilt_rewards"] == report["original_rewards"] == {"reward": 1.0}
    assert report["same_ending"] is True and "ending: same (rebuild ok, original ok)" in done.stdout


def test_replay_of_a_tampered_run_is_not_faithful(ok_run: Path, workdir: Path) -> None:
    tampered = workdir / "tampered" / ok_run.name
    shutil.copytree(ok_run, tampered)
    lines = trajectory(tampered)
    observation = next(m for m in reversed(lines[1]["request"]["body"]["messages"]) if m["role"] == "tool")
    observation["content"] = observation["content"].replace("def mean", "def median")
    (tampered / "trajectory" / "llm_trajectory.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines)
    )
    manifest = read_json(tampered / "workspace_manifest.json")
    manifest["calc.py"] = "0" * 64
    (tampered / "workspace_manifest.json").write_text(json.dumps(manifest))
    # Claim the run timed out: the rebuild then should have asked for more, but it finishes.
    (tampered / "result.json").write_text(json.dumps({"status": "timeout", "error_category": "timeout"}))
    done = reroll_cli("replay", str(tampered), "--output", "replay-tampered", cwd=workdir)
    assert done.returncode == 1, done.stderr
    assert "requests matched: 4/5" in done.stdout and "verdict: not faithful" in done.stdout
    assert "changed: calc.py" in done.stdout
    assert "ending: differs (rebuild ok, original timeout)" in done.stdout
    report = read_json(only_run(workdir / "replay-tampered") / "fidelity.json")
    assert report["faithful"] is False
    assert [step["verdict"] for step in report["steps"]] == ["match", "diverged", "match", "match", "match"]
    assert report["steps"][1]["detail"]
    assert report["workspace"]["changed"] == ["calc.py"] and not report["workspace"]["missing"]
    assert report["same_ending"] is False


def test_branch_two_models_twice_each(ok_run: Path, workdir: Path, fast_model: str) -> None:
    done = reroll_cli(
        "branch", str(ok_run), "--at", "2", "--model", fast_model, "--model", WRONG_FIX, "-n", "2",
        "--timeout", "120", "--output", "branches", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "mean reward per model" in done.stdout
    parent = only_run(workdir / "branches")
    assert read_json(parent / "config.json")["branched_from"]["path"] == str(ok_run)
    assert trajectory(parent) == trajectory(ok_run)[:2]
    summary = read_json(parent / "summary.json")
    assert summary["cut_index"] == 2 and summary["original"] == str(ok_run)
    means = {
        model["model"]: (model["branches"], model["scored"], model["mean_reward"])
        for model in summary["models"]
    }
    assert means == {fast_model: (2, 2, 1.0), WRONG_FIX: (2, 2, 0.0)}
    assert len(summary["children"]) == 4
    for child in summary["children"]:
        folder = parent / child["folder"]
        provenance = read_json(folder / "config.json")["branched_from"]
        assert provenance["path"] == str(parent) and provenance["cut_index"] == 2
        assert (provenance["live_model"], provenance["branch_index"]) == (
            child["model"],
            child["branch_index"],
        )
        assert read_json(folder / "result.json")["rewards"] == child["rewards"]
        assert sources(folder)[:3] == ["replayed", "replayed", "live"]


def test_branch_by_snapshot_restores_the_agent_s_process(
    ok_run: Path, workdir: Path, fast_model: str
) -> None:
    """mini-swe-agent keeps its conversation in its memory: ``--via snapshot`` dumps its process
    tree at the cut (CRIU) and each child restores it; the children start live at the cut with
    the original's workspace, and their first request carries the turns before it."""
    done = reroll_cli(
        "branch", str(ok_run), "--at", "2", "--model", fast_model, "-n", "2", "--via", "snapshot",
        "--timeout", "120", "--output", "by-process", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    parent = only_run(workdir / "by-process")
    summary = read_json(parent / "summary.json")
    assert summary["via"] == "snapshot", summary["note"]
    assert "process tree" in summary["note"] and "process" in summary["layers"]
    step = parent / "_prefix" / "checkpoints" / "step-2"
    assert (step / "process.json").is_file() and any((step / "process").iterdir())
    recorded = trajectory(ok_run)
    said = [m["content"] for m in recorded[2]["request"]["body"]["messages"] if m["role"] == "assistant"]
    assert len(said) == 2
    for child in summary["children"]:
        folder = parent / child["folder"]
        assert read_json(folder / "config.json")["branched_from"]["via"] == "snapshot"
        assert read_json(RunPaths(folder).restored_checkpoint)["step"] == 2
        assert sources(folder) == ["live", "live", "live"], "the prefix replayed instead of forked"
        first = trajectory(folder)[0]["request"]["body"]["messages"]
        assert [m["content"] for m in first if m["role"] == "assistant"] == said, (
            "the restored agent's first request lacks the conversation before the cut"
        )
        assert read_json(folder / "result.json")["rewards"] == {"reward": 1.0}
