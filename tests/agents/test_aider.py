"""aider (aider-chat from PyPI, unmodified) end to end, once in the `local` sandbox and once in
`docker`: record until the timeout → `reroll continue` to reward 1.0 → `reroll replay` matches
every step with the same workspace → a strict replay-only rebuild replays every step.

aider speaks plain Chat Completions with its own few-shot examples first (the script counts only
its own answers: ``count: own``), edits by SEARCH/REPLACE blocks, makes the workspace a git
repository and asks for a commit message after each applied edit (the script's ``commit``
thread). The install (~750 MB, ~5 min) happens once per machine (agent cache) and per docker
volume; the tests share it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.test_main_job import only_folder, read_json, reroll, trajectory

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
RECORD_TIMEOUT_SECONDS = 90
"""Generous: aider takes 5 to 15 s to start on a loaded machine; turn 2 never comes in time."""
# The first test's set-up installs aider when the agent cache or docker volume lacks it (~5 min
# once, more on a loaded machine), beyond the suite's 300 s default.
pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sandbox_backend: str) -> Path:
    return tmp_path_factory.mktemp(f"aider-{sandbox_backend}")


@pytest.fixture(scope="module")
def recorded(workdir: Path, sandbox_backend: str) -> Path:
    """aider's run cut by the timeout after turn 1 (a SEARCH block that fails) and its commit."""
    script = yaml.safe_load((TASK / "scripted-model.aider.yaml").read_text())
    script["turns"][1]["delay_seconds"] = 3600
    stalling = workdir / "stall-at-turn-2.yaml"
    stalling.write_text(yaml.safe_dump(script))
    done = reroll(
        "run", str(TASK), "--agent", "aider", "--model", f"scripted:{stalling}",
        "--timeout", str(RECORD_TIMEOUT_SECONDS), "--jobs-dir", "jobs", "--job-name", "record",
        "--sandbox", sandbox_backend, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return only_folder(workdir / "jobs" / "record")


@pytest.fixture(scope="module")
def continued(recorded: Path, workdir: Path) -> Path:
    done = reroll("continue", str(recorded), "--model", "scripted", "--timeout", "180", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return only_folder(recorded.parent / "continued")


def test_the_recording_holds_the_failed_edit_and_its_commit_message(recorded: Path) -> None:
    result = read_json(recorded / "result.json")
    assert result["status"] == "timeout" and result["counts"]["live"] == 2
    first, commit = trajectory(recorded)
    assert "SEARCH" in first["response"]["body"]["choices"][0]["message"]["content"]
    assert "commit message" in commit["request"]["body"]["messages"][0]["content"]
    assert commit["response"]["body"]["choices"][0]["message"]["content"].startswith("fix:")


def test_continue_finishes_with_reward_one(continued: Path) -> None:
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"] == {"exchanges": 4, "replayed": 2, "live": 2, "divergences": 0}
    manifest = read_json(continued / "workspace_manifest.json")
    assert ".git/HEAD" in manifest  # aider committed its edits


def test_replay_matches_every_step_and_the_workspace(continued: Path, workdir: Path) -> None:
    done = reroll("replay", str(continued), "--timeout", "180", cwd=workdir)
    assert done.returncode == 0, done.stderr
    report = read_json(only_folder(continued.parent / "replayed") / "fidelity.json")
    assert [step["verdict"] for step in report["steps"]] == ["match"] * 4
    # git's commits are the same (fixed identity and dates); only .git/index differs by design.
    assert report["workspace"]["equal"] and set(report["workspace"]["volatile"]) <= {
        ".git/index",
        ".aider.tags.cache.v4/cache.db",
    }
    assert report["faithful"] and report["rebuilt_rewards"] == {"reward": 1.0}


def test_a_strict_replay_only_rebuild_replays_every_step(continued: Path, workdir: Path) -> None:
    done = reroll(
        "continue", str(continued), "--replay-only", "--on-divergence", "strict", "--timeout", "180",
        "--output", "strict", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rebuilt = only_folder(workdir / "strict")
    result = read_json(rebuilt / "result.json")
    assert result["counts"] == {"exchanges": 4, "replayed": 4, "live": 0, "divergences": 0}
    lines = trajectory(rebuilt)
    assert [line["metadata"]["replayed_from"] for line in lines] == [0, 1, 2, 3]
    assert json.dumps(lines[1]["response"]["body"]) == json.dumps(
        trajectory(continued)[1]["response"]["body"]
    )
