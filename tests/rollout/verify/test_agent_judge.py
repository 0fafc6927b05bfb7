"""The agent-judge declaration (`reroll.rollout.verify.agent_judge`): BenchFlow's ``agent-judge`` strategy
in verifier/verifier.md and its options, the judge's prompt and the task it runs; bad
declarations are refused naming the task or the file. The judge end to end is in
tests/e2e/test_agent_judged_example.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reroll.rollout.verify.agent_judge import (
    VERDICT_FILE,
    VERDICT_VERIFIER,
    AgentJudgeVerifier,
    VerdictFileVerifier,
    judge_instruction,
    judge_task,
)
from reroll.rollout.verify.input_judge import agent_judge_verifier
from reroll.rollout.verify.verifiers import load_verifier, verifier_for
from reroll.tasks.rubric import document_body, document_strategy
from reroll.tasks.task import Task, load_task
from reroll_contracts.errors import TaskError

STRATEGY = """---
verifier:
  default_strategy: judge
  strategies:
    judge:
      type: agent-judge
      role: judge
      isolation: verifier-only
      inputs: [/app/answer.md]
{fields}
---

Judges answer.md.

## role:judge

Check that answer.md answers the question.
"""


def judged(tmp_path: Path, examples: Path, fields: str, *, rubric: bool = True) -> Path:
    """A copy of the example task whose verifier.md declares an agent-judge with BenchFlow's
    three fields (role ``judge``, its section) and `fields` (YAML lines of the strategy), with or
    without its rubric."""
    task = tmp_path / "task"
    shutil.copytree(examples / "changelog-entry", task)
    document = STRATEGY.format(fields="\n".join(f"      {line}" for line in fields.splitlines()))
    (task / "verifier" / "verifier.md").write_text(document)
    if not rubric:
        shutil.rmtree(task / "verifier" / "rubrics")
    return task


def test_the_example_declares_an_agent_judge_in_verifier_md(examples: Path) -> None:
    task = load_task(examples / "changelog-entry")
    assert task.spec.verifier.type == "agent-judge"
    assert task.spec.verifier.options == {
        "role": "judge",
        "isolation": "verifier-only",
        "inputs": ["/app/CHANGES.md"],
        "agent": "mini-swe-agent",
        "model": "scripted:scripted-judge-agent.yaml",
        "rubric": "rubrics/verifier.toml",
        "timeout_sec": 180,
    }
    verifier = verifier_for(task)
    assert isinstance(verifier, AgentJudgeVerifier)
    assert (verifier.agent.name, verifier.options.timeout_sec) == ("mini-swe-agent", 180)
    assert verifier.rubric is not None and [c.name for c in verifier.rubric.criteria] == [
        "mentions-flag",
        "short",
    ]
    assert verifier.instructions.startswith("Read `CHANGES.md` in the workspace")
    script = examples / "changelog-entry" / "scripted-judge-agent.yaml"
    assert verifier.model_spec(None) == f"scripted:{script}"  # relative: inside the task folder
    assert verifier.model_spec("openai/gpt-4o") == "openai/gpt-4o"  # --judge-model wins


def test_agent_judge_is_a_verifier_type_and_strategy(tmp_path: Path, examples: Path) -> None:
    assert load_verifier("agent-judge") is agent_judge_verifier
    task = judged(tmp_path, examples, "model: scripted")
    fields = {
        "role": "judge",
        "isolation": "verifier-only",
        "inputs": ["/app/answer.md"],
        "model": "scripted",
    }
    assert document_strategy(task / "verifier") == ("agent-judge", fields)
    assert document_body(task / "verifier").endswith("Check that answer.md answers the question.")


def test_an_agent_judge_with_an_agent_is_told_its_role_section(tmp_path: Path, examples: Path) -> None:
    task = judged(tmp_path, examples, "agent: mini-swe-agent\nmodel: scripted", rubric=False)
    verifier = verifier_for(load_task(task))
    assert isinstance(verifier, AgentJudgeVerifier)
    assert (verifier.agent.name, verifier.rubric, verifier.options.timeout_sec) == (
        "mini-swe-agent",
        None,
        600,
    )
    assert verifier.instructions == "Check that answer.md answers the question."
    assert verifier.model_spec(None) == "scripted"


def test_an_instructions_file_replaces_the_role_section(tmp_path: Path, examples: Path) -> None:
    task = judged(tmp_path, examples, "agent: mini-swe-agent\ninstructions: judge.md")
    (task / "verifier" / "judge.md").write_text("Be strict.\n")
    verifier = verifier_for(load_task(task))
    assert isinstance(verifier, AgentJudgeVerifier)
    assert verifier.instructions == "Be strict."
    assert verifier.model_spec(None) is None  # no model anywhere: a verifier_error at verify time


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("temperature: 0.5", r"(?s)invalid agent-judge verifier\.options:\n.*temperature"),
        ("timeout_sec: 0", r"(?s)invalid agent-judge verifier\.options:\n.*timeout_sec"),
        ("agent: no-such-agent", r"agent-judge agent: unknown agent 'no-such-agent'"),
        ("agent: oracle", r"agent-judge agent 'oracle' calls no model"),
        ("rubric: rubrics/missing.toml", r"the rubric .*missing\.toml \(verifier rubric\) is missing"),
        (
            "instructions: ../task.md",
            r"agent-judge instructions \.\./task\.md must be inside the verifier folder",
        ),
        ("instructions: missing.md", r"missing\.md: cannot read the agent-judge instructions"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_cause(
    tmp_path: Path, examples: Path, fields: str, message: str
) -> None:
    fields = fields if fields.startswith("agent:") else f"agent: mini-swe-agent\n{fields}"
    task = load_task(judged(tmp_path, examples, fields))
    with pytest.raises(TaskError, match=message):
        verifier_for(task)


def test_a_judge_with_nothing_to_judge_by_is_refused(tmp_path: Path, examples: Path) -> None:
    task = load_task(judged(tmp_path, examples, "agent: mini-swe-agent\nmodel: scripted", rubric=False))
    (task.verifier_dir / "verifier.md").write_text(
        (task.verifier_dir / "verifier.md")
        .read_text()
        .replace("Check that answer.md answers the question.", "")
    )
    with pytest.raises(TaskError, match=r"an agent-judge needs something to judge by"):
        verifier_for(task)


def test_the_judge_is_told_the_task_the_rubric_and_where_the_verdict_goes(examples: Path) -> None:
    task = load_task(examples / "changelog-entry")
    verifier = verifier_for(task)
    assert isinstance(verifier, AgentJudgeVerifier)
    prompt = judge_instruction(task, verifier.rubric, verifier.instructions, verifier.options.inputs)
    assert "Look first at: /app/CHANGES.md" in prompt
    assert task.instruction.strip() in prompt
    assert "- mentions-flag (binary, weight 2): The entry names `reroll rescore --judge-model`." in prompt
    assert verifier.instructions in prompt
    assert f"write your verdict as one JSON object to {VERDICT_FILE}" in prompt


def test_the_judge_task_has_no_services_solution_or_tests_and_runs_unprivileged(
    tmp_path: Path, examples: Path
) -> None:
    task: Task = load_task(examples / "mail-calendar")
    assert task.spec.environment.services and task.spec.environment.mcp_servers and task.solution_dir
    judge = judge_task(task, "Judge it.\n", tmp_path / "workspace.tar", 42.0)
    assert (judge.instruction, judge.solution_dir, judge.agent_user) == ("Judge it.\n", None, "agent")
    environment = judge.spec.environment
    assert (environment.services, environment.mcp_servers, environment.state) == ([], [], None)
    assert judge.spec.agent.timeout_sec == 42.0
    assert judge.spec.verifier.type == VERDICT_VERIFIER
    verdict = verifier_for(judge)
    assert isinstance(verdict, VerdictFileVerifier)
    assert verdict.options.workspace_tar == tmp_path / "workspace.tar"
    assert task.spec.environment.services  # the judged task is left as it was
