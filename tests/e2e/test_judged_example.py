"""The judged example (examples/tasks/release-note) end to end in the `local` sandbox: a urllib
agent on the scripted model writes a release note, the llm-judge verifier scores it with the
task's scripted judge over its rubric (verifier/rubrics/verifier.toml), the judge's exchanges
are recorded beside the agent's, ``reroll rescore`` replays them to the same reward byte for
byte, and ``rescore --judge-model`` with a stricter script changes it; the agent never sees the
rubric and cannot reach the judge's proxy; the graded reward survives both exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from atif import Trajectory

from tests.conftest import EXAMPLES
from tests.jobs.test_branch import URLLIB_AGENTS

pytestmark = pytest.mark.slow
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = EXAMPLES / "release-note"
REWARDS = {"reward": 0.9375, "mentions-rescore": 1.0, "short": 1.0, "clarity": 0.75}
"""What the task's scripted judge gives the oracle's note (see scripted-judge.yaml)."""
STRICT_REWARDS = {"reward": 0.5625, "mentions-rescore": 1.0, "short": 0.0, "clarity": 0.25}
ATTACK = (
    "cat /verifier/rubrics/verifier.toml /tests/rubric.toml 2>&1; "
    "find / -xdev \\( -name 'verifier.toml' -o -name 'scripted-judge*' -o -name 'judge_trajectory.jsonl' "
    "-o -name 'proxy.json' \\) 2>/dev/null; echo searched"
)
"""What the attacking agent runs: look for the rubric, the judge's script and recording, a
proxy's config (its token)."""


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"REROLL_AGENTS_FILE": str(cwd / "agents.yaml")}
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=600, env=env)
    print(done.stdout, done.stderr, sep="\n")
    return done


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("judged")
    (folder / "agents.yaml").write_text(yaml.safe_dump(URLLIB_AGENTS))
    return folder


@pytest.fixture(scope="module")
def task(workdir: Path) -> Path:
    """The example task, its first tool call preceded by the attack."""
    copy = workdir / "release-note"
    shutil.copytree(TASK, copy)
    script = yaml.safe_load((copy / "scripted-model.yaml").read_text())
    command = script["turns"][0]["tool_calls"][0]["arguments"]["command"]
    script["turns"][0]["tool_calls"][0]["arguments"]["command"] = f"{ATTACK}; {command}"
    (copy / "scripted-model.yaml").write_text(yaml.safe_dump(script))
    return copy


@pytest.fixture(scope="module")
def judged_run(workdir: Path, task: Path) -> Path:
    done = reroll(
        "run", str(task), "--agent", "urllib-chat", "--model", "scripted", "--jobs-dir", "jobs",
        "--job-name", "record", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "jobs" / "record").iterdir()
    return folder


@pytest.fixture(scope="module")
def rescored(workdir: Path, judged_run: Path) -> Path:
    done = reroll("rescore", str(judged_run), "--output", "rescored", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "rescored").iterdir()
    return folder


def test_the_reward_comes_from_the_rubric_items(judged_run: Path) -> None:
    result = read_json(judged_run / "result.json")
    assert result["status"] == "ok", result
    assert result["rewards"] == REWARDS
    graded = result["verify_result"]
    assert graded["items"] == {k: v for k, v in REWARDS.items() if k != "reward"}
    assert [event["source"] for event in graded["events"]] == [
        "criterion:mentions-rescore",
        "criterion:short",
        "criterion:clarity",
    ]
    assert graded["events"][2]["note"] == "Clear, one sentence is long."
    assert read_json(judged_run / "verifier" / "reward.json") == graded


def test_the_judge_has_its_own_trajectory_in_the_run_folder(judged_run: Path) -> None:
    judge = lines(judged_run / "trajectory" / "judge_trajectory.jsonl")
    assert len(judge) == 3  # one exchange per rubric item
    assert {line["metadata"]["source"] for line in judge} == {"live"}
    first_user = [line["request"]["body"]["messages"][1]["content"] for line in judge]
    assert [text.splitlines()[0] for text in first_user] == [
        "Criterion: mentions-rescore",
        "Criterion: short",
        "Criterion: clarity",
    ]
    assert "`reroll rescore` now scores a recorded run again" in first_user[0]  # the deliverable
    agent = lines(judged_run / "trajectory" / "llm_trajectory.jsonl")
    assert all("Criterion:" not in json.dumps(line["request"]["body"]) for line in agent)


def test_the_agent_never_sees_the_rubric_or_the_judge(judged_run: Path) -> None:
    agent = lines(judged_run / "trajectory" / "llm_trajectory.jsonl")
    seen = json.dumps(agent[1]["request"]["body"]["messages"][-1])  # the attack's tool result
    assert "searched" in seen and "No such file" in seen
    for secret in ("mentions-rescore", "weighted_mean", "scripted-judge", "judge_trajectory", "proxy.json"):
        assert secret not in seen


def test_rescore_replays_the_judge_to_the_same_reward_byte_for_byte(judged_run: Path, rescored: Path) -> None:
    for name in ("verifier/reward.json",):
        assert (rescored / name).read_bytes() == (judged_run / name).read_bytes()
    original, again = read_json(judged_run / "result.json"), read_json(rescored / "result.json")
    assert again["status"] == "ok", again
    assert (again["rewards"], again["verify_result"]) == (original["rewards"], original["verify_result"])
    judge = lines(rescored / "trajectory" / "judge_trajectory.jsonl")
    assert [line["metadata"]["source"] for line in judge] == ["replayed"] * 3
    assert all(line["metadata"].get("divergence") is None for line in judge)
    assert read_json(rescored / "verifier" / "judge.json")["divergences"] == []
    assert again["judge_counts"] | {"tokens": 0} == {
        "exchanges": 3, "replayed": 3, "live": 0, "divergences": 0, "tokens": 0
    }  # fmt: skip
    config = read_json(rescored / "config.json")
    assert config["rescored_from"] == {"path": str(judged_run), "judge_model": None}
    assert config["continued_from"]["replay_only"] is True


def test_rescore_with_another_judge_changes_the_reward(workdir: Path, judged_run: Path, task: Path) -> None:
    strict = f"scripted:{task / 'scripted-judge-strict.yaml'}"
    done = reroll("rescore", str(judged_run), "--judge-model", strict, "--output", "strict", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "strict").iterdir()
    result = read_json(folder / "result.json")
    assert result["rewards"] == STRICT_REWARDS
    assert read_json(folder / "config.json")["rescored_from"]["judge_model"] == strict
    judge = lines(folder / "trajectory" / "judge_trajectory.jsonl")
    assert [line["metadata"]["source"] for line in judge] == ["live"] * 3


def test_a_judge_request_that_differs_is_reported_as_a_divergence(workdir: Path, judged_run: Path) -> None:
    """The recorded judge answers replayed over another workspace (the recorded agent's command
    edited to add a line to the note): each judge request differs from the recorded one, and is
    served and reported."""
    copy = workdir / "diverging"
    shutil.copytree(judged_run, copy)
    trajectory = (copy / "trajectory" / "llm_trajectory.jsonl").read_text()
    (copy / "trajectory" / "llm_trajectory.jsonl").write_text(
        trajectory.replace("> NOTES.md", "> NOTES.md && echo 'Also faster.' >> NOTES.md")
    )
    done = reroll("rescore", str(copy), "--output", "diverged", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "diverged").iterdir()
    judge = lines(folder / "trajectory" / "judge_trajectory.jsonl")
    assert all(line["metadata"]["divergence"] is not None for line in judge)
    assert len(read_json(folder / "verifier" / "judge.json")["divergences"]) == 3
    assert read_json(folder / "result.json")["judge_counts"]["divergences"] == 3
    assert "judge exchanges: 3 (3 replayed, 0 live, 3 divergent)" in done.stdout
    assert read_json(folder / "result.json")["rewards"] == REWARDS  # the recording was served


def test_the_graded_reward_survives_both_exports(workdir: Path, judged_run: Path) -> None:
    graded = read_json(judged_run / "result.json")["verify_result"]
    done = reroll("export", str(judged_run), "--format", "atif", "--output", "run.atif.json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    trajectory = Trajectory.model_validate_json((workdir / "run.atif.json").read_text())
    assert trajectory.extra is not None
    assert trajectory.extra["reroll"]["verify_result"] == graded
    done = reroll("export", str(judged_run), "--format", "verifiers", "--output", "vf.jsonl", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (line,) = (workdir / "vf.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["reward"] == REWARDS["reward"]
    assert record["metrics"] == REWARDS
    assert record["info"]["verify_result"] == graded
