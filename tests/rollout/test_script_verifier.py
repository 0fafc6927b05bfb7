"""The verifier's host side: which pytest plugins a task declares (``[verifier] pytest_plugins``,
and ``ctrf`` inferred from a test script that passes ``--ctrf``, as BenchFlow does)."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.rollout.script_verifier import declared_plugins
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError

from tests.test_reward_hacks import write_files


def legacy_task(root: Path, toml: str, test_sh: str) -> Path:
    return write_files(root, {"task.toml": toml, "instruction.md": "Do it.\n", "tests/test.sh": test_sh})


@pytest.mark.parametrize(
    ("toml", "test_sh", "expected"),
    [
        ('[verifier]\npytest_plugins = ["xdist", "timeout"]\n', "pytest /tests\n", ["xdist", "timeout"]),
        ("", "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA\n", ["ctrf"]),
        ("", "uvx -w pytest-json-ctrf==0.3.5 pytest --ctrf=/logs/c.json /tests\n", ["ctrf"]),
        ('[verifier]\npytest_plugins = ["ctrf"]\n', "pytest --ctrf x.json\n", ["ctrf"]),
        ("", "# pytest --ctrf report.json (not used)\npytest /tests\n", []),
        ("", "pytest --ctrf-extra /tests\n", []),
    ],
)
def test_declared_plugins(tmp_path: Path, toml: str, test_sh: str, expected: list[str]) -> None:
    assert declared_plugins(load_task(legacy_task(tmp_path, toml, test_sh))) == expected


def test_declared_plugins_without_a_test_script_are_the_declared_ones(tmp_path: Path) -> None:
    task = load_task(legacy_task(tmp_path, '[verifier]\npytest_plugins = ["ctrf"]\n', "exit 0\n"))
    (tmp_path / "tests" / "test.sh").unlink()  # gone since loading: `verify` reports it, not this
    assert declared_plugins(task) == ["ctrf"]


def test_pytest_plugins_must_be_a_list_of_names(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"task.toml: invalid task configuration(.|\n)*pytest_plugins"):
        load_task(legacy_task(tmp_path, '[verifier]\npytest_plugins = "ctrf"\n', "exit 0\n"))
