"""The verifier's host side: which pytest plugins a task declares (``[verifier] pytest_plugins``,
and ``ctrf`` inferred from a test script that passes ``--ctrf``, as BenchFlow does), a test
script that crashed before its tests ran (a ``verifier_error``, not a reward of 0), and
BenchFlow's script strategy with its own command (``python3 grade.py``) run from the verifier
folder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from reroll.rollout.verify.script_verifier import (
    command_script,
    could_not_run,
    crashed_before_its_tests,
    declared_plugins,
    effective_hardening,
    script_name,
)
from reroll.sandbox.results import HardeningReport, VerifyOutcome
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError

from tests.e2e.test_reward_hacks import run_oracle, write_files


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


NOT_STARTED = b"ERROR: usage: pytest [options]\npytest: error: unrecognized arguments: --ctrf\n"


def _outcome(
    rewards: dict[str, float],
    pytest_report: str = "",
    timed_out: bool = False,
    stdout: bytes = NOT_STARTED,
    notes: tuple[str, ...] = (),
) -> VerifyOutcome:
    return VerifyOutcome(
        hardening=HardeningReport(killed_groups=0, restored=[], deleted=[], notes=list(notes)),
        exit_code=0,
        timed_out=timed_out,
        stdout=stdout,
        stderr=b"",
        reward_file="reward.txt",
        reward_content=b"0\n",
        rewards=rewards,
        reward_error="",
        pytest_report=pytest_report,
    )


SKILLSBENCH_TEST_SH = (
    "pip3 install --break-system-packages pytest==8.4.1 pytest-json-ctrf==0.3.5\n"
    "pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA -v\n"
    "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
)


@pytest.mark.parametrize(
    ("toml", "test_sh", "outcome", "crashed"),
    [
        ("", SKILLSBENCH_TEST_SH, _outcome({"reward": 0.0}), True),  # pytest never started
        ("", "python3 -m pytest /tests\n", _outcome({"reward": 0.0}), True),
        ("", SKILLSBENCH_TEST_SH, _outcome({"reward": 0.0}, "pytest's report: 3 tests, 1 failures"), False),
        ("", SKILLSBENCH_TEST_SH, _outcome({"reward": 1.0}), False),  # a pass is not overruled
        ("", SKILLSBENCH_TEST_SH, _outcome({"reward": 0.0}, timed_out=True), False),  # a timeout says so
        ("", "python3 /tests/check.py  # not pytest\n", _outcome({"reward": 0.0}), False),
        ("", "pip install pytest-json-ctrf\npython3 check.py\n", _outcome({"reward": 0.0}), False),
        (
            "",
            "python3 -m pytest /tests\n",
            _outcome({"reward": 0.0}, stdout=b"No module named pytest\n"),
            True,
        ),
        # a script that falls back when pytest is missing, and whose fallback failed: the agent's 0
        (
            "",
            "python3 -m pytest /tests || python3 t.py\n",
            _outcome({"reward": 0.0}, stdout=b"AssertionError\n"),
            False,
        ),
        # the agent shadowed the image's ctrf: the hardening refused it, pytest refused --ctrf
        (
            "",
            SKILLSBENCH_TEST_SH,
            _outcome({"reward": 0.0}, notes=("pytest plugin 'ctrf' not loaded: /opt/agent-site/ctrf",)),
            False,
        ),
        (
            "[verifier.hardening]\npytest_report = false\n",
            SKILLSBENCH_TEST_SH,
            _outcome({"reward": 0.0}),
            False,
        ),
    ],
)
def test_crashed_before_its_tests_only_when_pytest_was_due_and_never_started(
    tmp_path: Path, toml: str, test_sh: str, outcome: VerifyOutcome, crashed: bool
) -> None:
    task = load_task(legacy_task(tmp_path, toml, test_sh))
    assert crashed_before_its_tests(task, outcome) is crashed


@pytest.mark.spawns
def test_a_test_script_that_crashes_before_its_tests_is_a_verifier_error(tmp_path: Path) -> None:
    """On the local sandbox: pytest refuses its command line (or is missing) before any test
    runs, and the script writes reward 0 as SkillsBench's do: ``error`` / ``verifier_error``."""
    test_sh = (
        "python3 -m pytest --no-such-option /tests\n"
        'if [ $? -eq 0 ]; then r=1; else r=0; fi; mkdir -p "$REROLL_LOGS_DIR/verifier"\n'
        'echo $r > "$REROLL_LOGS_DIR/verifier/reward.txt"\n'
    )
    task = legacy_task(tmp_path / "crash", "", test_sh)
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\ntrue\n")
    result, _ = run_oracle(task, tmp_path, backend="local")
    assert (result["status"], result["error_category"]) == ("error", "verifier_error"), result
    assert "crashed before its tests ran" in result["error"]


@pytest.mark.parametrize(
    ("test_sh", "pytest_report"),
    [
        ("pytest --junitxml=/logs/verifier/junit.xml /tests\n", False),
        ("python3 -m pytest --junit-xml /logs/j.xml /tests\n", False),
        ("pytest /tests  # --junitxml=x.xml once\n", True),
        ("pytest --ctrf /logs/verifier/ctrf.json /tests\n", True),
    ],
)
def test_a_test_script_with_its_own_junit_report_is_scored_by_its_reward_file(
    tmp_path: Path, test_sh: str, pytest_report: bool
) -> None:
    assert effective_hardening(load_task(legacy_task(tmp_path, "", test_sh))).pytest_report is pytest_report


UVX_MISSING = b"/tests/test.sh: 3: uvx: not found\n"


@pytest.mark.parametrize(
    ("outcome", "diagnosed"),
    [
        (_outcome({"reward": 0.0}, stdout=UVX_MISSING), True),
        (_outcome({"reward": 1.0}, stdout=UVX_MISSING), False),  # it ran all the same
        (_outcome({"reward": 0.0}, "pytest's report: 1 tests", stdout=UVX_MISSING), False),  # agent code ran
        (_outcome({"reward": 0.0}, timed_out=True, stdout=UVX_MISSING), False),
    ],
)
def test_could_not_run_only_before_pytest_started(
    tmp_path: Path, outcome: VerifyOutcome, diagnosed: bool
) -> None:
    task = load_task(legacy_task(tmp_path, "", "uvx pytest /tests\n"))
    assert (could_not_run(task, outcome) is not None) is diagnosed


SCRIPT_TASK = Path(__file__).parents[2] / "fixtures" / "benchflow-script-strategy"
"""A task in BenchFlow's format whose verifier.md's script strategy runs ``python3 grade.py
--expected expected.txt`` (no test.sh): reward.json's two items, all must pass, and reward.txt."""


@pytest.mark.spawns
@pytest.mark.parametrize(("answer", "expected"), [("42", 1.0), ("41", 0.0)], ids=["oracle", "wrong"])
def test_a_script_strategy_command_scores_the_run_on_local(
    tmp_path: Path, answer: str, expected: float
) -> None:
    """The oracle's answer scores 1.0 and a wrong one 0.0, read from the files grade.py wrote
    (it finds expected.txt only when it runs from the verifier folder)."""
    task = tmp_path / "task"
    shutil.copytree(SCRIPT_TASK, task)
    (task / "oracle" / "solve.sh").write_text(f"#!/bin/sh\necho {answer} > answer.txt\n")
    result, folder = run_oracle(task, tmp_path, backend="local", timeout_seconds=300)
    assert result["status"] == "ok", result
    assert result["rewards"]["reward"] == expected
    assert result["verify_result"]["items"] == {"exists": 1.0, "correct": expected}
    assert result["verify_result"]["aggregate"]["method"] == "all_pass"
    assert (folder / "verifier" / "reward.json").is_file()


@pytest.mark.spawns
def test_the_command_script_runs_the_command_from_its_folder_as_bash_would(tmp_path: Path) -> None:
    """``./run.sh`` (not executable, as a task's file may be) is made executable and run from the
    verifier folder, whatever the working folder it is started in, with bash's ``[[ ]]``."""
    folder = tmp_path / "verifier"
    folder.mkdir()
    (folder / "run.sh").write_text('#!/bin/sh\necho "ran in $(pwd) with $1"\n')
    (folder / "run.sh").chmod(0o644)
    script = folder / ".reroll-command.sh"
    script.write_bytes(command_script("./run.sh 'a b' && [[ -x run.sh ]] && echo executable"))
    script.chmod(0o755)
    done = subprocess.run(
        ["sh", "-c", 'exec "$0"', str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"ran in {folder} with a b\nexecutable\n"


def test_the_command_script_refuses_a_command_with_no_words() -> None:
    with pytest.raises(TaskError, match=r"verifier command ' ' is not a shell command"):
        command_script(" ")


def test_a_script_strategy_task_runs_the_command_script_and_its_pytest_counts(tmp_path: Path) -> None:
    """The sidecar runs the command's script, not test.sh; pytest's ``--ctrf`` in the command
    declares its plugin as it would in test.sh."""
    assert script_name(load_task(SCRIPT_TASK)) == ".reroll-command.sh"
    task = tmp_path / "task"
    shutil.copytree(SCRIPT_TASK, task)
    (task / "verifier" / "test_answer.py").write_text("def test_answer():\n    pass\n")
    (task / "verifier" / "verifier.md").write_text(
        "---\nverifier: {strategies: {s: {type: script, "
        "command: python3 -m pytest --ctrf /logs/verifier/ctrf.json test_answer.py}}}\n---\n"
    )
    loaded = load_task(task)
    assert declared_plugins(loaded) == ["ctrf"]
