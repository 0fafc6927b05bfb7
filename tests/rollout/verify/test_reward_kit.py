"""The ``reward-kit`` verifier: BenchFlow's Reward Kit runner with its manifest, variables and
strict criteria (`reroll.rollout.verify.reward_kit`, `reroll.tasks.strategies`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from reroll.rollout.verify.reward_kit import (
    MANIFEST_VERSION,
    check_criteria,
    environment,
    manifest,
    runner_command,
    sandbox_paths,
)
from reroll.sandbox.layout import SandboxLayout
from reroll.tasks.rubric import command_files
from reroll.tasks.strategies import criteria_policy, reward_kit_strategy
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError, VerifierError

from tests.e2e.test_reward_hacks import run_oracle

KIT_TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-reward-kit"
"""A task in BenchFlow's format scored by a reward-kit strategy: ``rewards/reward.py`` writes four
metrics, ``rewards/criteria.toml`` weighs them 0.1, 0.2, 0.6, 0.1 (weighted mean)."""
LAYOUT = SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/root", agents_dir="/agents")


def _copy(tmp_path: Path) -> Path:
    task = tmp_path / "task"
    shutil.copytree(KIT_TASK, task)
    return task


def _strategy_file(task: Path, fields: str) -> None:
    """Replace the fixture's strategy line block with `fields` (YAML flow mapping)."""
    doc = task / "verifier" / "verifier.md"
    text = doc.read_text()
    start, end = text.index("    rewardkit:\n"), text.index("  rubric:")
    doc.write_text(text[:start] + f"    rewardkit: {fields}\n" + text[end:])


def test_the_fixture_loads_as_a_reward_kit_task_whose_criteria_make_its_policy() -> None:
    task = load_task(KIT_TASK)
    assert task.spec.verifier.type == "reward-kit"
    assert task.spec.verifier.options == {"root": "rewards", "criteria": "rewards/criteria.toml"}
    assert task.spec.verifier.aggregate_policy == {
        "field": "reward",
        "method": "weighted_mean",
        "threshold": 0.7,
        "criteria": ["exists", "number", "correct", "one_line"],
        "weights": {"exists": 0.1, "number": 0.2, "correct": 0.6, "one_line": 0.1},
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("{type: reward-kit}", "root must be a non-empty string"),
        ("{type: reward-kit, root: /abs}", "must be a relative path without '..'"),
        ("{type: reward-kit, root: ../up}", "must be a relative path without '..'"),
        ("{type: reward-kit, root: rewards, entrypoint: run.py}", "the runner"),
        ("{type: reward-kit, root: rewards, criteria: rewards/none.toml}", "the criteria file"),
    ],
)
def test_a_bad_strategy_is_refused_at_load_naming_the_field_or_file(
    tmp_path: Path, fields: str, message: str
) -> None:
    task = _copy(tmp_path)
    _strategy_file(task, fields)
    with pytest.raises(TaskError, match=message) as caught:
        load_task(task)
    assert "verifier.md" in str(caught.value) or str(task) in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml [", "cannot load it"),
        ("[scoring]\naggregation = 'mean'\n", "declares no criteria"),
        ("[scoring]\naggregation = 'median'\n[[criterion]]\nname = 'a'\n", "unsupported scoring method"),
        ("[scoring]\nthreshold = 2\n[[criterion]]\nname = 'a'\n", "invalid scoring threshold"),
        ("[[criterion]]\nname = 'a'\n[[criterion]]\nname = 'a'\n", "duplicate id 'a'"),
        ("[[criterion]]\nname = 'a'\nweight = -1\n", "invalid weight for 'a'"),
        ("[[criterion]]\nname = 'a'\ntype = 'ranking'\n", "unsupported type"),
        ("[[criterion]]\ndescription = ''\n", "empty id"),
    ],
)
def test_a_bad_criteria_file_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "criteria.toml"
    path.write_text(text)
    with pytest.raises(TaskError, match=message) as caught:
        criteria_policy(path)
    assert str(path) in str(caught.value)


def test_criteria_ids_default_as_benchflow_reads_them(tmp_path: Path) -> None:
    """``mean`` reads as weighted_mean; an id is name, else id, else title, else the description's
    first 40 characters; a JSON rubric (``criteria``) works too."""
    path = tmp_path / "criteria.json"
    criteria = [{"id": "a"}, {"title": "b", "weight": 2}, {"description": "c" * 50}]
    path.write_text(json.dumps({"scoring": {"method": "mean"}, "criteria": criteria}))
    policy = criteria_policy(path)
    assert policy["method"] == "weighted_mean"
    assert policy["weights"] == {"a": 1.0, "b": 2.0, "c" * 40: 1.0}


def test_the_manifest_and_variables_name_the_sandbox_paths() -> None:
    task = load_task(KIT_TASK)
    strategy = reward_kit_strategy(task.spec.verifier.options, task.verifier_dir)
    paths = sandbox_paths(task, strategy, LAYOUT)
    built = manifest(task, strategy, paths)
    assert built["version"] == MANIFEST_VERSION == "benchflow.reward-kit.v1"
    assert built["verifier"] == {
        "name": "answer-report",
        "document_version": "0.3",
        "default_strategy": "rewardkit",
    }
    assert built["strategy"]["entrypoint"] == "reward.py"
    config = {"type": "reward-kit", "root": "rewards", "criteria": "rewards/criteria.toml"}
    assert built["strategy"]["config"] == config
    assert built["paths"]["criteria"] == "/verifier/rewards/criteria.toml"
    assert built["outputs"]["declared_reward_json"] is True
    assert built["criteria_policy"] == task.spec.verifier.aggregate_policy
    env = environment(paths, "/logs/verifier/reward-kit-manifest.json")
    assert env["BENCHFLOW_REWARD_KIT_ROOT"] == "/verifier/rewards"
    assert env["BENCHFLOW_REWARD_DETAILS_JSON"] == "/logs/verifier/reward-details.json"
    command = runner_command(strategy, "/logs/verifier/m.json", json.dumps(built, indent=2))
    # the test-script verifier reads the files the command names (pytest inside them counts)
    assert command_files(command, task.verifier_dir) == [task.verifier_dir / "rewards" / "reward.py"] * 2


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"reward.txt": "1.0\n"}, "must write reward.json"),
        ({"reward.json": '{"reward": 1.0, "metrics": {"a": 1.0, "b": 0.0}}'}, "does not match"),
        ({"reward.json": '{"reward": 0.5, "metrics": {"a": 1.0}}'}, "exactly the declared criteria"),
        ({"reward.json": "{broken"}, "reward.json"),
    ],
)
def test_declared_criteria_are_strict(tmp_path: Path, files: dict[str, str], message: str) -> None:
    """As BenchFlow: with criteria, reward.txt alone is an error, and a stated reward must be the
    criteria's aggregate of exactly their items."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    policy = {"method": "weighted_mean", "criteria": ["a", "b"], "weights": {"a": 1.0, "b": 1.0}}
    with pytest.raises(VerifierError, match=message):
        check_criteria(tmp_path, policy)
    (tmp_path / "reward.json").write_text('{"reward": 0.5, "metrics": {"a": 1.0, "b": 0.0}}')
    check_criteria(tmp_path, policy)


def _scores(tmp_path: Path, answer: str, expected: float, backend: str) -> None:
    """The oracle writing `answer` scores `expected` on `backend` (see the tests below)."""
    task = _copy(tmp_path)
    (task / "oracle" / "solve.sh").write_text(f"#!/bin/sh\necho {answer} > answer.txt\n")
    result, folder = run_oracle(task, tmp_path, backend=backend, timeout_seconds=600)
    assert result["status"] == "ok", result
    assert result["rewards"]["reward"] == pytest.approx(expected, abs=1e-9)
    correct = 1.0 if answer == "42" else 0.0
    items = {"exists": 1.0, "number": 1.0, "correct": correct, "one_line": 1.0}
    assert result["verify_result"]["items"] == items
    assert result["verify_result"]["aggregate"]["method"] == "weighted_mean"
    kept = json.loads((folder / "verifier" / "reward-kit-manifest.json").read_text())
    assert kept["version"] == "benchflow.reward-kit.v1"
    assert json.loads((folder / "verifier" / "reward-details.json").read_text())["expected"] == "42"


@pytest.mark.spawns
@pytest.mark.parametrize(("answer", "expected"), [("42", 1.0), ("41", 0.4)], ids=["oracle", "wrong"])
def test_a_reward_kit_runner_scores_the_run_on_local(tmp_path: Path, answer: str, expected: float) -> None:
    """The oracle scores 1.0; a wrong number 0.4, BenchFlow's weighted mean of the criteria
    (0.1 + 0.2 + 0.1 of 1.0): the runner ran from the verifier folder, read the manifest written
    before it, and the run folder keeps it."""
    _scores(tmp_path, answer, expected, "local")


@pytest.mark.slow
@pytest.mark.spawns
@pytest.mark.parametrize(("answer", "expected"), [("42", 1.0), ("41", 0.4)], ids=["oracle", "wrong"])
def test_a_reward_kit_runner_scores_the_run_on_docker(
    tmp_path: Path, answer: str, expected: float, docker_images: str
) -> None:
    """As on local, in reroll's Debian image, which has ``python3`` and no ``python``."""
    _scores(tmp_path, answer, expected, "docker")
