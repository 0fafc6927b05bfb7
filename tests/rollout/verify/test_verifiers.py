"""The verifier seam (`reroll.rollout.verify.verifiers`): the task's ``verifier.type`` picks the class,
an unknown one is refused before anything is written, and a verifier from outside reroll (named
by its dotted path, as a judge would be) scores a real rollout through the same calls."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from reroll.rollout.commands.record import run_task
from reroll.rollout.verify.script_verifier import TestScriptVerifier
from reroll.rollout.verify.verifiers import VERIFIERS, Verdict, VerifyRequest, verifier_for
from reroll.sandbox.base import Sandbox
from reroll.tasks.task import Task, load_task
from reroll_contracts.errors import TaskError


class OutputJudge:
    """A stand-in for a judge: reads the agent's log in the run folder and a file in the sandbox;
    rewards 1.0 when both hold its ``expect`` option; status ``error`` (``infrastructure``, as a
    judge whose model is down) when the option asks it to fail."""

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        if "expect" not in options:
            raise TaskError(f"task {task.name}: OutputJudge needs verifier.options.expect")
        self.options = dict(options)
        self.prepared = False

    async def prepare(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        self.prepared = True

    async def verify(self, request: VerifyRequest) -> Verdict:
        if self.options.get("fail"):
            return Verdict(
                {}, 0.1, status="error", error_category="infrastructure", error="judge unreachable"
            )
        log = (request.run_dir / "agent" / "output.log").read_text()
        workspace = request.sandbox.layout.workspace
        written = (await request.sandbox.get_file(f"{workspace}/hello.txt")).decode()
        request.output_dir.mkdir(parents=True, exist_ok=True)
        (request.output_dir / "judge.txt").write_text(f"log: {log!r}\nfile: {written!r}\n")
        found = self.prepared and self.options["expect"] in written
        return Verdict({"reward": float(found), "log_bytes": float(len(log))}, 0.1, output="judged")


def task_with_verifier(tmp_path: Path, examples: Path, verifier: str) -> Path:
    """hello-file with its task.md's ``verifier:`` section replaced by `verifier` (YAML)."""
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    text = (task / "task.md").read_text()
    (task / "task.md").write_text(text.replace("verifier:\n  timeout_sec: 30\n", verifier))
    return task


def test_the_default_is_the_test_script_verifier(examples: Path) -> None:
    task = load_task(examples / "hello-file")
    assert task.spec.verifier.type == "test-script"
    assert sorted(VERIFIERS) == ["agent-judge", "llm-judge", "ors-episode", "reward-kit", "test-script"]
    assert isinstance(verifier_for(task), TestScriptVerifier)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            "verifier:\n  type: magic-kit\n",
            r"task hello-file \(.*\): unknown verifier.type 'magic-kit'; known: agent-judge, llm-judge,",
        ),
        ("verifier:\n  type: nowhere.at_all:Judge\n", r"verifier.type 'nowhere.at_all:Judge': cannot import"),
        ("verifier:\n  options: {model: m}\n", r"test-script takes no verifier.options \(got model\)"),
    ],
)
def test_a_verifier_that_cannot_be_made_is_a_task_error_naming_the_task(
    tmp_path: Path, examples: Path, section: str, message: str
) -> None:
    task = load_task(task_with_verifier(tmp_path, examples, section))
    with pytest.raises(TaskError, match=message):
        verifier_for(task)


async def test_an_unknown_verifier_type_is_refused_before_anything_is_written(
    tmp_path: Path, examples: Path
) -> None:
    task = task_with_verifier(tmp_path, examples, "verifier:\n  type: magic-kit\n")
    with pytest.raises(TaskError, match=r"unknown verifier\.type 'magic-kit'"):
        await run_task(task, agent_name="oracle", jobs_dir=tmp_path / "jobs", job_name="j")
    assert not (tmp_path / "jobs").exists()


@pytest.mark.spawns  # a real rollout: sidecar and proxy processes
@pytest.mark.parametrize("fail", [False, True])
async def test_a_verifier_from_outside_reroll_scores_a_real_rollout(
    tmp_path: Path, examples: Path, fail: bool
) -> None:
    options = json.dumps({"expect": "Hello, reroll!", "fail": fail})
    section = f"verifier:\n  type: tests.rollout.verify.test_verifiers:OutputJudge\n  options: {options}\n"
    task = task_with_verifier(tmp_path, examples, section)
    outcome = await run_task(task, agent_name="oracle", jobs_dir=tmp_path / "jobs", job_name="j")
    result = json.loads((outcome.run_dir / "result.json").read_text())
    assert result["timings"]["verifier_seconds"] == 0.1
    if fail:
        assert (result["status"], result["error_category"], result["error"]) == (
            "error",
            "infrastructure",
            "judge unreachable",
        )
        assert result["rewards"] is None
        return
    assert result["status"] == "ok", result
    assert result["rewards"]["reward"] == 1.0, result
    assert "file: 'Hello, reroll!\\n'" in (outcome.run_dir / "verifier" / "judge.txt").read_text()
    assert not (outcome.run_dir / "verifier" / "test-stdout.txt").exists()  # test.sh never ran


@pytest.mark.spawns
@pytest.mark.parametrize("valid", [True, False])
async def test_a_test_script_may_write_the_structured_reward(
    tmp_path: Path, examples: Path, valid: bool
) -> None:
    """reward.json's structured form (`reroll_contracts.reward`) from test.sh: result.json keeps the
    flat rewards and adds verify_result; an invalid one is a verifier error naming the file."""
    task = task_with_verifier(tmp_path, examples, "verifier:\n  timeout_sec: 30\n")
    space = "action" if valid else "vibes"
    reward = (
        '{"reward": 0.5, "items": {"file": 1.0, "style": 0.0}, '
        f'"events": [{{"source": "wrote-file", "reward": 1.0, "step": 0, "space": "{space}", '
        '"granularity": "step"}]}'
    )
    (task / "verifier" / "test.sh").write_text(f"#!/bin/sh\necho '{reward}' > /logs/verifier/reward.json\n")
    outcome = await run_task(task, agent_name="oracle", jobs_dir=tmp_path / "jobs", job_name="j")
    result = json.loads((outcome.run_dir / "result.json").read_text())
    if not valid:
        assert (result["status"], result["error_category"]) == ("error", "verifier_error")
        assert "verifier/reward.json: invalid structured reward" in result["error"]
        assert "events.0.space" in result["error"]
        return
    assert result["status"] == "ok", result
    assert result["rewards"] == {"reward": 0.5, "file": 1.0, "style": 0.0}
    assert result["verify_result"]["events"][0] == {
        "source": "wrote-file",
        "reward": 1.0,
        "step": 0,
        "space": "action",
        "granularity": "step",
        "note": "",
    }
