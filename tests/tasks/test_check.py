"""`reroll task check` on a folder mixing valid, foreign-field and broken tasks (in process)."""

from __future__ import annotations

import shutil
from pathlib import Path

from reroll.cli.app import app
from typer.testing import CliRunner


def test_task_check_of_a_mixed_folder(tmp_path: Path, examples: Path) -> None:
    shutil.copytree(examples / "hello-file", tmp_path / "valid")
    foreign = tmp_path / "nested" / "harbor"
    (foreign / "tests").mkdir(parents=True)
    (foreign / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (foreign / "instruction.md").write_text("Do it.\n")
    (foreign / "task.toml").write_text(
        'version = "1.0"\n[environment]\nmemory = "4G"\ngpus = 1\nallow_internet = false\n'
        '[[steps]]\nname = "a"\n'
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.md").write_text("---\nagent:\n  timeout_sec: -1\n---\nDo it.\n")
    (broken / "verifier").mkdir()
    (broken / "verifier" / "test.sh").write_text("#!/bin/sh\n")
    (tmp_path / "not-a-task").mkdir()  # searched, holds nothing

    done = CliRunner().invoke(app, ["task", "check", str(tmp_path)], terminal_width=200)

    assert done.exit_code == 2, done.output
    assert "2 of 3 tasks load" in done.output
    assert f"{broken}: does not load" in done.output and "greater than 0" in done.output
    assert "environment.memory → environment.memory_mb" in done.output
    assert "4096 MiB" in done.output and "network              │ none" in done.output
    assert "environment.gpus: GPUs are not attached" in done.output
    assert "steps: multi-step tasks are not supported" in done.output


def test_task_check_exits_0_when_every_task_loads(examples: Path) -> None:
    done = CliRunner().invoke(app, ["task", "check", str(examples)], terminal_width=200)
    assert done.exit_code == 0, done.output
    assert "7 of 7 tasks load" in done.output


def test_task_check_of_a_folder_without_tasks(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["task", "check", str(tmp_path)], terminal_width=200)
    assert done.exit_code == 2
    assert "no task.md or task.toml in it or below it" in done.output
