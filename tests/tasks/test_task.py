"""Loading tasks in the native and the legacy layout, and the errors for bad tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reroll.tasks.task import find_task, load_task
from reroll_contracts.errors import TaskError


def test_native_task_loads_front_matter_and_prompt(examples: Path) -> None:
    task = load_task(examples / "fix-failing-test")
    assert task.layout == "native"
    assert task.name == "fix-failing-test"
    assert task.instruction.startswith("The unit tests in `test_calc.py` fail.")
    assert task.spec.agent.timeout_sec == 300
    assert task.spec.environment.network == "none"
    assert task.verifier_mount == "/verifier"
    assert task.solution_dir == examples / "fix-failing-test" / "oracle"
    assert task.workspace_seed_dir is not None and (task.workspace_seed_dir / "calc.py").is_file()


def test_legacy_task_loads_toml_and_instruction(examples: Path) -> None:
    task = load_task(examples / "word-count")
    assert task.layout == "legacy"
    assert task.spec.verifier.timeout_sec == 60
    assert task.verifier_dir.name == "tests"
    assert task.solution_mount == "/solution"
    assert "wordcount.py" in task.instruction


def test_missing_task_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="not a directory"):
        load_task(tmp_path / "nope")


def test_folder_without_task_file(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"neither task\.md nor task\.toml"):
        load_task(tmp_path)


def test_invalid_front_matter_names_the_file(tmp_path: Path, examples: Path) -> None:
    task_dir = tmp_path / "bad"
    shutil.copytree(examples / "hello-file", task_dir)
    (task_dir / "task.md").write_text("---\nagent: [unclosed\n---\nDo it.\n")
    with pytest.raises(TaskError, match=r"task\.md: invalid YAML"):
        load_task(task_dir)


def test_invalid_field_type_names_the_file(tmp_path: Path, examples: Path) -> None:
    task_dir = tmp_path / "bad"
    shutil.copytree(examples / "hello-file", task_dir)
    (task_dir / "task.md").write_text("---\nagent:\n  timeout_sec: soon\n---\nDo it.\n")
    with pytest.raises(TaskError, match="invalid task configuration"):
        load_task(task_dir)


@pytest.mark.parametrize(
    "front", ["agent:\n  timeout_sec: -5", "verifier:\n  timeout_sec: 0", "environment:\n  memory_mb: -1"]
)
def test_a_negative_or_zero_budget_is_refused(tmp_path: Path, examples: Path, front: str) -> None:
    task_dir = tmp_path / "bad"
    shutil.copytree(examples / "hello-file", task_dir)
    (task_dir / "task.md").write_text(f"---\n{front}\n---\nDo it.\n")
    with pytest.raises(TaskError, match=r"(?s)task.md: invalid task configuration.*greater than 0"):
        load_task(task_dir)


def test_a_task_folder_that_is_a_symlink_loop_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "task").symlink_to(tmp_path / "task")
    with pytest.raises(TaskError, match=f"task {tmp_path / 'task'}: cannot be resolved"):
        load_task(tmp_path / "task")


def test_missing_verifier_script(tmp_path: Path, examples: Path) -> None:
    task_dir = tmp_path / "t"
    shutil.copytree(examples / "hello-file", task_dir)
    (task_dir / "verifier" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"verifier entry point is missing"):
        load_task(task_dir)


def test_find_task_prefers_tasks_dir(examples: Path) -> None:
    assert find_task("hello-file", examples).path == examples / "hello-file"
    with pytest.raises(TaskError, match="looked in"):
        find_task("no-such-task", examples)


def write_task(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


BENCHFLOW_NATIVE = {
    "task.md": "---\nsandbox:\n  memory_mb: 512\nverifier:\n  hardening:\n    cleanup_conftests: true\n"
    "---\n\n## prompt\n\nSay hello.\n",
    "tests/test.sh": "#!/bin/sh\n",
}


def test_benchflow_native_task_with_tests_folder_and_prompt_heading(tmp_path: Path) -> None:
    task = load_task(write_task(tmp_path, BENCHFLOW_NATIVE))
    assert task.instruction == "Say hello.\n"
    assert task.verifier_dir == tmp_path / "tests" and task.verifier_mount == "/tests"
    assert task.spec.environment.memory_mb == 512
    assert task.ignored == []


def test_task_md_that_does_not_load_falls_back_to_task_toml(tmp_path: Path) -> None:
    files = {
        **BENCHFLOW_NATIVE,
        "task.md": "---\nagent: [unclosed\n---\nHi\n",
        "task.toml": '[environment]\nmemory = "4G"\n',
        "instruction.md": "From the toml.\n",
    }
    task = load_task(write_task(tmp_path, files))
    assert task.layout == "legacy" and task.instruction == "From the toml.\n"
    assert task.spec.environment.memory_mb == 4096
    assert task.ignored[0].field == "task.md" and "invalid YAML" in task.ignored[0].note


def test_both_configurations_broken_names_both(tmp_path: Path) -> None:
    files = {**BENCHFLOW_NATIVE, "task.md": "---\nagent: [unclosed\n---\nHi\n", "task.toml": "[agent\n"}
    with pytest.raises(
        TaskError, match=r"(?s)task\.md: invalid YAML.*task\.toml does not load either.*invalid TOML"
    ):
        load_task(write_task(tmp_path, files))


def test_a_valid_task_md_beside_task_toml_wins_and_says_so(tmp_path: Path) -> None:
    files = {**BENCHFLOW_NATIVE, "task.toml": "[agent]\n", "instruction.md": "other\n"}
    task = load_task(write_task(tmp_path, files))
    assert task.layout == "native" and [note.field for note in task.ignored] == ["task.toml"]


def test_conventions_per_layout(examples: Path, tmp_path: Path) -> None:
    native, legacy = load_task(examples / "native-verifier"), load_task(examples / "harbor-ctrf")
    assert (native.agent_user, native.verifier_mount, native.solution_mount) == (
        "agent",
        "/verifier",
        "/oracle",
    )
    assert (legacy.agent_user, legacy.verifier_mount, legacy.solution_mount) == (None, "/tests", "/solution")
    assert native.workdir is None and load_task(examples / "skillsbench-yaml").workdir == "/root"
    files = {**BENCHFLOW_NATIVE, "task.md": "---\nagent:\n  user: root\n---\nHi\n"}
    assert load_task(write_task(tmp_path, files)).agent_user == "root"


def test_prompt_prefix_goes_before_the_prompt(tmp_path: Path) -> None:
    files = {**BENCHFLOW_NATIVE, "task.md": "---\nagent:\n  prompt_prefix: Do not cheat.\n---\nSay hello.\n"}
    assert load_task(write_task(tmp_path, files)).instruction == "Do not cheat.\n\nSay hello.\n"


def test_benchflow_path_shorthands_name_the_verifier_and_oracle_folders(tmp_path: Path) -> None:
    files = {
        "task.md": "---\nverifier: checks\noracle: reference/\n---\nSay hello.\n",
        "checks/test.sh": "#!/bin/sh\n",
        "reference/solve.sh": "#!/bin/sh\n",
    }
    task = load_task(write_task(tmp_path, files))
    assert (task.verifier_dir, task.verifier_mount) == (tmp_path / "checks", "/verifier")
    assert (task.solution_dir, task.solution_mount) == (tmp_path / "reference/", "/oracle")
    files["task.md"] = "---\nverifier: ../elsewhere\n---\nSay hello.\n"
    with pytest.raises(TaskError, match="must be a relative path inside the task"):
        load_task(write_task(tmp_path, files))
