"""LLM-judge rubrics and strategy declarations in BenchFlow's files (`reroll.tasks.rubric`): the
native verifier/verifier.md + verifier/rubrics/verifier.toml, the legacy [verifier.judge] +
tests/rubric.toml, a Harvey LAB rubric.json; bad files are refused naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reroll.rollout.verify.judge import LlmJudgeVerifier
from reroll.rollout.verify.verifiers import verifier_for
from reroll.tasks.rubric import Criterion, Scoring, load_rubric, task_policy
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError
from reroll_contracts.graded import AggregatePolicy

RUBRIC_TOML = """
[judge]
model = "scripted:judge.yaml"

[[criterion]]
name = "accurate"
description = "The answer is accurate."
weight = 3.0
space = "action"

[[criterion]]
description = "The answer is clear."
type = "likert"
points = 5
"""


def legacy_task(tmp_path: Path, judge: str = "", rubric: tuple[str, str] | None = None) -> Path:
    """A legacy llm-judge task without test.sh: task.toml's [verifier] and `judge` (its
    [verifier.judge] body), `rubric` as (path in the task, content)."""
    task = tmp_path / "legacy"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Write an answer into answer.md.\n")
    (task / "task.toml").write_text(f'[verifier]\ntype = "llm-judge"\n\n[verifier.judge]\n{judge}\n')
    if rubric is not None:
        (task / rubric[0]).parent.mkdir(parents=True, exist_ok=True)
        (task / rubric[0]).write_text(rubric[1])
    return task


def test_the_native_layout_declares_the_judge_in_verifier_md(examples: Path) -> None:
    task = load_task(examples / "release-note")
    assert (task.spec.verifier.type, task.layout) == ("llm-judge", "native")
    assert not (task.verifier_dir / "test.sh").exists()
    verifier = verifier_for(task)
    assert isinstance(verifier, LlmJudgeVerifier)
    assert verifier.rubric.path == examples / "release-note" / "verifier" / "rubrics" / "verifier.toml"
    assert [c.name for c in verifier.rubric.criteria] == ["mentions-rescore", "short", "clarity"]
    assert "names the new command" in verifier.rubric.notes  # rubrics/verifier.md, for the judge
    assert verifier.model_spec(None) == f"scripted:{examples / 'release-note' / 'scripted-judge.yaml'}"
    assert verifier.model_spec("openai/gpt-4o") == "openai/gpt-4o"  # --judge-model wins


def test_the_legacy_layout_reads_verifier_judge_and_tests_rubric_toml(tmp_path: Path) -> None:
    task = load_task(legacy_task(tmp_path, 'model = "openai/gpt-4o"', ("tests/rubric.toml", RUBRIC_TOML)))
    assert task.spec.verifier.options == {"model": "openai/gpt-4o"}
    assert ("verifier.judge", "verifier.options") in [(n.field, n.note) for n in task.mapped]
    verifier = verifier_for(task)
    assert isinstance(verifier, LlmJudgeVerifier)
    assert verifier.rubric.path == task.path / "tests" / "rubric.toml"
    accurate, clear = verifier.rubric.criteria
    assert (accurate.weight, accurate.space, clear.name, clear.type) == (
        3.0,
        "action",
        "The answer is clear.",
        "likert",
    )
    assert verifier.model_spec(None) == "openai/gpt-4o"  # the task's, over the rubric's [judge]


def test_a_rubric_path_names_the_file_relative_to_the_task(tmp_path: Path) -> None:
    task = legacy_task(tmp_path, 'rubric_path = "grading/r.toml"', ("grading/r.toml", RUBRIC_TOML))
    verifier = verifier_for(load_task(task))
    assert isinstance(verifier, LlmJudgeVerifier)
    assert verifier.rubric.path == task / "grading" / "r.toml"
    assert verifier.model_spec(None) == f"scripted:{task / 'judge.yaml'}"  # the rubric's [judge] model


def test_a_harvey_lab_rubric_json_is_read(tmp_path: Path) -> None:
    rubric = (
        '{"title": "Memo", "criteria": [{"id": "c-1", "title": "Risks", '
        '"match_criteria": "Names the key risks"}, {"id": "c-2", "match_criteria": "Cites evidence"}]}'
    )
    verifier = verifier_for(load_task(legacy_task(tmp_path, rubric=("tests/rubric.json", rubric))))
    assert isinstance(verifier, LlmJudgeVerifier)
    assert [(c.name, c.description) for c in verifier.rubric.criteria] == [
        ("c-1", "Names the key risks"),
        ("c-2", "Cites evidence"),
    ]
    assert verifier.rubric.notes == "Memo"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[[criterion]\nname = 1", r"rubric\.toml: cannot load the rubric"),
        ('[scoring]\naggregation = "weighted_mean"\n', r"(?s)rubric\.toml: invalid rubric:\n.*criteria"),
        ('[[criterion]]\ndescription = "x"\ntype = "stars"\n', r"(?s)rubric\.toml: invalid rubric:\n.*type"),
        ('[[criterion]]\ndescription = "x"\nspace = "vibes"\n', r"(?s)invalid rubric:\n.*space"),
        (
            '[[criterion]]\ndescription = "x"\ntype = "numeric"\nmin = 5\nmax = 5\n',
            r"max \(5.0\) must be above",
        ),
    ],
)
def test_a_malformed_rubric_is_refused_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    task = load_task(legacy_task(tmp_path, rubric=("tests/rubric.toml", content)))
    with pytest.raises(TaskError, match=message):
        verifier_for(task)


def test_a_judged_task_without_a_rubric_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"needs a rubric \(looked for .*tests/rubric\.toml"):
        verifier_for(load_task(legacy_task(tmp_path)))


def test_a_rubric_outside_the_task_is_refused(tmp_path: Path) -> None:
    task = load_task(legacy_task(tmp_path, 'rubric_path = "../secret.toml"'))
    with pytest.raises(TaskError, match=r"must be a relative path inside the task"):
        verifier_for(task)


def test_unknown_judge_options_are_refused(tmp_path: Path) -> None:
    task = load_task(legacy_task(tmp_path, "temperature = 0.5", ("tests/rubric.toml", RUBRIC_TOML)))
    with pytest.raises(TaskError, match=r"(?s)invalid llm-judge verifier\.options:\n.*temperature"):
        verifier_for(task)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("---\nverifier: [1\n---\n", r"verifier\.md: invalid YAML front matter"),
        (
            "---\nverifier: {name: x}\n---\n",
            r"verifier\.md: the front matter declares no verifier\.strategies",
        ),
        (
            "---\nverifier: {default_strategy: b, strategies: {a: {type: script}}}\n---\n",
            r"default_strategy 'b' is not one of a",
        ),
        ("---\nverifier: {strategies: {a: {type: magic}}}\n---\n", r"type 'magic'; reroll scores"),
        ("---\nverifier: {strategies: {a: {command: ./test.sh}}}\n---\n", r"type None; reroll scores"),
        ("---\nverifier: {strategies: {a: {type: reward-kit}}}\n---\n", r"reward-kit strategy: root must be"),
        (
            "---\nverifier: {strategies: {a: {type: script}}}\n---\n",
            r"strategy 'a': a script strategy's command must be a non-empty string \(BenchFlow runs no",
        ),
        (
            "---\nverifier: {strategies: {a: {type: script, command: make}}}\n---\n",
            r"verifier command 'make' names no file of the verifier folder",
        ),
    ],
)
def test_a_bad_verifier_md_is_refused_naming_it(
    tmp_path: Path, examples: Path, document: str, message: str
) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    (task / "verifier" / "verifier.md").write_text(document)
    with pytest.raises(TaskError, match=message):
        load_task(task)


def test_a_script_strategy_is_the_test_script_verifier(tmp_path: Path, examples: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    (task / "verifier" / "verifier.md").write_text(
        "---\nverifier: {default_strategy: s, strategies: {s: {type: script, command: ./test.sh}}}\n---\n"
    )
    loaded = load_task(task)
    assert (loaded.spec.verifier.type, loaded.spec.verifier.options) == ("test-script", {})


SCRIPT_STRATEGY = "strategies: {s: {type: script, command: ./test.sh}}"
SCRIPT_TASK = Path(__file__).parents[1] / "fixtures" / "benchflow-script-strategy"


def test_a_script_strategy_with_a_relative_command_becomes_the_verifier_command() -> None:
    """BenchFlow's ``script`` strategy with ``python3 grade.py ...`` (no test.sh in the folder):
    the task loads, the command is the test-script verifier's."""
    verifier = load_task(SCRIPT_TASK).spec.verifier
    assert not (SCRIPT_TASK / "verifier" / "test.sh").exists()
    assert (verifier.type, verifier.options) == ("test-script", {})
    assert verifier.command == "python3 grade.py --expected expected.txt"


@pytest.mark.parametrize("command", ["./test.sh", "bash test.sh"])
def test_a_command_naming_test_sh_runs_it_as_without_verifier_md(
    tmp_path: Path, examples: Path, command: str
) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    (task / "verifier" / "verifier.md").write_text(
        f"---\nverifier: {{strategies: {{s: {{type: script, command: {command}}}}}}}\n---\n"
    )
    assert load_task(task).spec.verifier.command is None


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("'/usr/bin/python3 grade.py'", r"'/usr/bin/python3' must be relative to the verifier folder"),
        ("../grade.py", r"'\.\./grade\.py' must be relative to the verifier folder"),
        ("python3 missing.py", r"names 'missing\.py', which is not a file of the verifier folder"),
        ("python3 ../verifier/grade.py", r"names '\.\./verifier/grade\.py', which is not a file"),
        ("python3 data/grade.py", r"names 'data/grade\.py', which is not a file"),
        ("pytest -q", r"'pytest -q' names no file of the verifier folder"),
        ('"python3 \'grade.py"', r"does not parse as a shell command"),
        ('"  "', r"command must be a non-empty string"),
        ("[python3, grade.py]", r"command must be a non-empty string"),
    ],
)
def test_a_script_command_benchflow_could_not_run_is_refused(
    tmp_path: Path, command: str, message: str
) -> None:
    task = tmp_path / "task"
    shutil.copytree(SCRIPT_TASK, task)
    (task / "verifier" / "verifier.md").write_text(
        f"---\nverifier: {{strategies: {{s: {{type: script, command: {command}}}}}}}\n---\n"
    )
    with pytest.raises(TaskError, match=message):
        load_task(task)


def test_a_verifier_file_with_the_command_scripts_name_is_refused(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(SCRIPT_TASK, task)
    (task / "verifier" / ".reroll-command.sh").write_text("#!/bin/sh\n")
    with pytest.raises(TaskError, match=r"\.reroll-command\.sh: this name is reroll's"):
        load_task(task)


def test_a_command_with_a_judge_verifier_is_refused(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(SCRIPT_TASK, task)
    (task / "verifier" / "verifier.md").unlink()
    text = (task / "task.md").read_text()
    judged = "verifier:\n  type: llm-judge\n  command: python3 grade.py\n"
    (task / "task.md").write_text(text.replace("verifier:\n", judged, 1))
    with pytest.raises(TaskError, match=r"verifier\.command is the test-script verifier's, not llm-judge's"):
        load_task(task)


def test_verifier_md_outputs_aggregate_policy_reaches_the_task(tmp_path: Path, examples: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    policy = "{method: weighted-mean, criteria: [a, b], metrics: {a: 1.0}}"
    (task / "verifier" / "verifier.md").write_text(
        f"---\nverifier: {{{SCRIPT_STRATEGY}, outputs: {{aggregate_policy: {policy}}}}}\n---\n"
    )
    loaded = load_task(task).spec.verifier
    assert loaded.aggregate_policy == {
        "method": "weighted-mean",
        "criteria": ["a", "b"],
        "metrics": {"a": 1.0},
    }
    assert task_policy(loaded.aggregate_policy) == AggregatePolicy(
        method="weighted_mean", criteria=("a", "b")
    )


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (
            "{aggregate_policy: {method: median}}",
            r"verifier\.md: verifier\.outputs\.aggregate_policy\.method must be one of",
        ),
        ("{aggregate_policy: {method: mean, weights: [1]}}", r"aggregate_policy\.weights must be a mapping"),
        ("{aggregate_policy: {criteria: a}}", r"aggregate_policy\.criteria must be a list"),
        ("[1]", r"verifier\.outputs must be a mapping"),
    ],
)
def test_a_bad_aggregate_policy_is_refused_naming_verifier_md(
    tmp_path: Path, examples: Path, outputs: str, message: str
) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    (task / "verifier" / "verifier.md").write_text(
        f"---\nverifier: {{{SCRIPT_STRATEGY}, outputs: {outputs}}}\n---\n"
    )
    with pytest.raises(TaskError, match=message):
        load_task(task)


def test_a_script_task_still_needs_its_test_sh(tmp_path: Path, examples: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "hello-file", task)
    (task / "verifier" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"verifier entry point is missing"):
        load_task(task)


def test_scores_are_normalised_and_aggregated_as_benchflow_does() -> None:
    binary = Criterion(name="b", description="b", weight=2)
    likert = Criterion(name="l", description="l", type="likert", points=5)
    numeric = Criterion(name="n", description="n", type="numeric", min=0, max=10)
    assert (binary.normalise(1), binary.normalise(0), likert.normalise(4), numeric.normalise(15)) == (
        1.0,
        0.0,
        0.75,
        1.0,
    )
    criteria, scores = [binary, likert, numeric], [1.0, 0.75, 0.25]
    assert Scoring().reward(criteria, scores) == (2 + 0.75 + 0.25) / 4
    assert Scoring(aggregation="all_pass").reward(criteria, scores) == 0.0
    assert Scoring(aggregation="any_pass").reward(criteria, scores) == 1.0
    assert Scoring(aggregation="threshold", threshold=0.7).reward(criteria, scores) == 1.0


def test_the_example_rubric_loads_on_its_own(examples: Path) -> None:
    rubric = load_rubric(examples / "release-note" / "verifier" / "rubrics" / "verifier.toml")
    assert [c.weight for c in rubric.criteria] == [2.0, 1.0, 1.0]
