"""BenchFlow's ``agent-judge`` strategy (`reroll.rollout.verify.input_judge`): role, isolation and
inputs declared in verifier.md, checked at load as BenchFlow's parser checks them; one judge call
over the inputs on the bundled scripted model, its answer read as BenchFlow reads it; ``reroll
rescore`` gives the same reward.json byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from reroll.rollout.verify.agent_judge import AgentJudgeVerifier
from reroll.rollout.verify.input_judge import InputJudgeVerifier, _score, agent_judge_verifier
from reroll.rollout.verify.verifiers import verifier_for
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError, VerifierError

from tests.e2e.test_reward_hacks import REROLL, run_oracle

TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-agent-judge"
"""A task in BenchFlow's format judged by an agent-judge ``review`` (role ``reviewer``, input
``/app/answer.txt``, the scripted judge: 1.0 for the oracle's 42, 0.0 otherwise)."""
STRATEGY = "      type: agent-judge\n      role: reviewer\n      isolation: verifier-only\n"


def variant(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of `TASK` whose verifier.md has `old` replaced by `new`."""
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    document = task / "verifier" / "verifier.md"
    assert old in document.read_text()
    document.write_text(document.read_text().replace(old, new))
    return task


def test_without_an_agent_it_is_benchflows_judge_call() -> None:
    task = load_task(TASK)
    verifier = verifier_for(task)
    assert isinstance(verifier, InputJudgeVerifier)
    assert (verifier.options.role, verifier.options.inputs, verifier.strategy) == (
        "reviewer",
        ["/app/answer.txt"],
        "review",
    )
    assert verifier.role_prompt.startswith("Check that answer.txt holds the right answer")
    judge = verifier.judge_model(None)
    assert judge is not None and judge.spec == f"scripted:{TASK / 'scripted-judge.yaml'}"
    prompt = verifier.prompt([("/app/answer.txt", "42\n", False)])
    assert verifier.role_prompt in prompt and task.instruction.strip() in prompt
    assert "=== /app/answer.txt ===\n42\n" in prompt
    assert isinstance(agent_judge_verifier(task, {**task.spec.verifier.options, "agent": "mini-swe-agent"}),
                      AgentJudgeVerifier)  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("      role: reviewer\n", "", "must declare role"),
        ("role: reviewer", "role: critic", r"role 'critic' names no '## role:critic' section"),
        ("      isolation: verifier-only\n", "", "must declare isolation"),
        ("isolation: verifier-only", "isolation: shared", "isolation must be 'verifier-only'"),
        ("      inputs: [/app/answer.txt]\n", "", "must declare inputs"),
        ("inputs: [/app/answer.txt]", "inputs: []", "inputs must be a non-empty list of strings"),
        ("inputs: [/app/answer.txt]", "inputs: [../x]", r"input '\.\./x' must stay inside"),
        ("## role:reviewer", "## reviewer", "names no '## role:reviewer' section"),
    ],
)
def test_a_field_benchflow_refuses_is_refused_at_load(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(variant(tmp_path, old, new))


def test_a_rubric_without_an_agent_is_refused_naming_the_fix(tmp_path: Path) -> None:
    task = load_task(variant(tmp_path, "      model:", "      rubric: r.toml\n      model:"))
    with pytest.raises(TaskError, match=r"(?s)rubric and instructions need an agent.*rubric"):
        verifier_for(task)


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ('{"score": 0.25, "reasoning": "meh"}', 0.25),
        ('Here: ```json\n{"reward": 1}\n```', 1.0),
        ('{"score": "0.5"}', 0.5),
        ('{"verdict": "PASSED"}', 1.0),
        ('{"verdict": "no"}', 0.0),
    ],
)
def test_the_answer_is_read_as_benchflow_reads_it(answer: str, score: float) -> None:
    assert _score(answer)[0] == score


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("I think it is fine.", "holds no JSON object"),
        ('{"score": 1.5}', "must be a number from 0.0 to 1.0"),
        ('{"score": true}', "must be a number from 0.0 to 1.0"),
        ('{"score": "high"}', "must be a number from 0.0 to 1.0"),
        ('{"verdict": "maybe"}', "no score and no pass/fail verdict"),
    ],
)
def test_an_unusable_answer_is_a_verifier_error(answer: str, message: str) -> None:
    with pytest.raises(VerifierError, match=message):
        _score(answer)


@pytest.mark.slow
@pytest.mark.spawns
def test_the_judge_scores_the_oracle_and_a_rescore_is_byte_identical(tmp_path: Path) -> None:
    result, folder = run_oracle(TASK, tmp_path, backend="local", timeout_seconds=600)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    assert result["verify_result"]["events"][0]["source"] == "agent-judge:reviewer"
    details = json.loads((folder / "verifier" / "reward-details.json").read_text())
    assert details["inputs"] == [{"path": "/app/answer.txt", "chars": 3, "truncated": False}]
    (judge,) = [
        json.loads(line)
        for line in (folder / "trajectory" / "judge_trajectory.jsonl").read_text().splitlines()
    ]
    assert "=== /app/answer.txt ===\n42\n" in judge["request"]["body"]["messages"][0]["content"]
    done = subprocess.run(
        [REROLL, "rescore", str(folder), "--output", "rescored"], capture_output=True, text=True,
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (again,) = (tmp_path / "rescored").iterdir()
    assert (again / "verifier" / "reward.json").read_bytes() == (
        folder / "verifier" / "reward.json"
    ).read_bytes()
    assert "1 replayed, 0 live" in done.stdout


@pytest.mark.slow
@pytest.mark.spawns
def test_a_wrong_answer_scores_zero(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    (task / "oracle" / "solve.sh").write_text("#!/bin/sh\necho 41 > answer.txt\n")
    result, _ = run_oracle(task, tmp_path, backend="local", timeout_seconds=600)
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 0.0}), result
    assert result["verify_result"]["events"][0]["note"] == "answer.txt does not hold 42."
