"""A judged task's model resolved at planning time (`reroll.rollout.verify.judge_model`): a
BenchFlow task's bare name goes to BenchFlow's provider, an unusable one is refused naming the
variable or ``--judge-model``, a task that needs no model (or names none) passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from reroll.rollout.verify.judge_model import check_judge_model, judge_flag
from reroll.tasks.task import load_task
from reroll_contracts.errors import ModelError

from tests.runfolder.test_run import exchange_line, make_run_folder

KEYS = ("REROLL_UPSTREAM_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY")


@pytest.fixture(autouse=True)
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)


def judged(tmp_path: Path, examples: Path, example: str, model: str | None) -> Path:
    """A copy of `example` whose verifier.md names judge `model` (None: no model line)."""
    task = tmp_path / example
    shutil.copytree(examples / example, task)
    document = task / "verifier" / "verifier.md"
    lines = document.read_text().splitlines(keepends=True)
    (line,) = [line for line in lines if line.strip().startswith("model: scripted:")]
    indent = line[: len(line) - len(line.lstrip())]
    document.write_text("".join(lines).replace(line, f"{indent}model: {model}\n" if model else ""))
    return task


UNKEYED_JUDGE = r"judge model 'claude-sonnet-4-6'.*ANTHROPIC_API_KEY.*--judge-model"
"""How the refusal of `unkeyed_judge_run`'s judge reads."""


def unkeyed_judge_run(tmp_path: Path, examples: Path, status: str, exchanges: int) -> Path:
    """A run folder (``job/run``, `status`, `exchanges` recorded) of a copy of ``release-note``
    whose judge is BenchFlow's ``model: claude-sonnet-4-6``: unusable here, no key is set (`KEYS`)."""
    task = judged(tmp_path, examples, "release-note", "claude-sonnet-4-6")
    lines = [exchange_line(index) for index in range(exchanges)]
    run = make_run_folder(tmp_path / "job" / "run", lines, result={"status": status})
    config = {
        "task_path": str(task),
        "agent": "mini-swe-agent",
        "model": "scripted",
        "sandbox": "local-plain",
    }
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_a_benchflow_bare_judge_name_is_anthropics(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = load_task(judged(tmp_path, examples, "release-note", "claude-sonnet-4-6"))
    with pytest.raises(ModelError) as refused:
        check_judge_model(task, None)
    message = str(refused.value)
    assert "task release-note: the judge model 'claude-sonnet-4-6' (the task's verifier model)" in message
    assert "needs ANTHROPIC_API_KEY in the environment" in message
    assert "or pass --judge-model SPEC" in message
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    model = check_judge_model(task, None)
    assert model is not None and (model.name, model.api_format) == ("claude-sonnet-4-6", "anthropic-messages")


def test_judge_model_overrides_the_tasks(tmp_path: Path, examples: Path) -> None:
    task = load_task(judged(tmp_path, examples, "release-note", "claude-sonnet-4-6"))
    script = examples / "release-note" / "scripted-judge.yaml"
    model = check_judge_model(task, f"scripted:{script}")
    assert model is not None and model.script == script.resolve()
    with pytest.raises(
        ModelError,
        match=r"'acme/x' \(--judge-model\).*unknown provider 'acme'.*or pass another --judge-model",
    ):
        check_judge_model(task, "acme/x")


def test_an_agent_judges_model_is_resolved_for_its_agent(tmp_path: Path, examples: Path) -> None:
    task = load_task(judged(tmp_path, examples, "changelog-entry", "gpt-4.1"))
    with pytest.raises(ModelError, match=r"'gpt-4.1' \(the task's verifier model\).*needs OPENAI_API_KEY"):
        check_judge_model(task, None)


def test_the_rubrics_model_is_named_as_its_source(tmp_path: Path, examples: Path) -> None:
    folder = judged(tmp_path, examples, "release-note", None)
    rubric = folder / "verifier" / "rubrics" / "verifier.toml"
    rubric.write_text('[judge]\nmodel = "gemini-3-pro"\n\n' + rubric.read_text())
    with pytest.raises(
        ModelError, match=r"\(the rubric's \[judge\] model \(.*verifier.toml\)\).*GEMINI_API_KEY"
    ):
        check_judge_model(load_task(folder), None)


def test_no_model_to_resolve(tmp_path: Path, examples: Path) -> None:
    """A test-script task asks no model; a judge naming none is left to its verdict
    (``verifier_error``), which ``reroll rescore --judge-model`` can fix later."""
    assert check_judge_model(load_task(examples / "hello-file"), None) is None
    assert check_judge_model(load_task(judged(tmp_path, examples, "release-note", None)), None) is None
    assert check_judge_model(load_task(examples / "release-note"), None) is not None  # its own script


def test_an_unusable_judge_model_flag_is_named(examples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--judge-model`` of ``run``, ``continue`` and ``rescore`` (`judge_flag`): the message names
    the flag beside the cause, and a relative script (from the working folder) is stored absolute."""
    task = load_task(examples / "release-note")
    monkeypatch.chdir(task.path)
    with pytest.raises(
        ModelError, match=r"--judge-model claude-x: .*needs ANTHROPIC_API_KEY.*or pass another --judge-model"
    ):
        judge_flag("claude-x", task)
    assert judge_flag("scripted:scripted-judge.yaml", task) == f"scripted:{task.path / 'scripted-judge.yaml'}"
