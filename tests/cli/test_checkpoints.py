"""Bad input to ``reroll continue --at``, ``reroll replay`` and ``reroll branch``: a clear message,
exit code 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.jobs.branch import branch
from reroll_contracts.errors import ConfigError

from tests.cli.test_errors import reroll, tree
from tests.runfolder.test_run import exchange_line, make_run_folder

pytestmark = pytest.mark.spawns  # every test runs the reroll CLI as a subprocess


def flat(text: str) -> str:
    """Usage errors come wrapped: collapse whitespace."""
    return " ".join(text.split())


@pytest.fixture
def run(tmp_path: Path, examples: Path) -> Path:
    """A finished two-exchange mini-swe-agent run of an example task (no agent is started)."""
    folder = make_run_folder(tmp_path / "run", [exchange_line(0), exchange_line(1)], result={"status": "ok"})
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "workspace_manifest.json").write_text(json.dumps({"calc.py": "0" * 64}))
    return folder


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("3", "--at 3 is out of range: the run has 2 recorded exchanges, so a step must be within 0..2"),
        ("1.5", "--at 1.5: a fraction must be within 0.0..1.0"),
        ("half", "--at 'half': expected a step index (0..2) or a fraction"),
    ],
)
@pytest.mark.parametrize("command", ["continue", "branch"])
def test_checkpoint_out_of_range(run: Path, tmp_path: Path, command: str, at: str, message: str) -> None:
    before = tree(tmp_path)
    done = reroll(command, str(run), "--at", at, "--model", "scripted", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and str(run) in done.stderr
    assert tree(tmp_path) == before


def test_strict_divergence_conflicts_with_another_policy(run: Path, tmp_path: Path) -> None:
    done = reroll("continue", str(run), "--strict-divergence", "--on-divergence", "cutover", cwd=tmp_path)
    assert done.returncode == 2
    assert "--strict-divergence conflicts with --on-divergence cutover" in flat(done.stderr)


@pytest.mark.parametrize("command", ["continue", "branch"])
def test_unknown_divergence_policy(run: Path, tmp_path: Path, command: str) -> None:
    done = reroll(
        command, str(run), "--at", "1", "--model", "scripted", "--on-divergence", "ignore", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "'ignore' is not one of 'warn', 'strict', 'cutover'" in flat(done.stderr)


def test_replay_missing_folder(tmp_path: Path) -> None:
    done = reroll("replay", str(tmp_path / "nope"), cwd=tmp_path)
    assert done.returncode == 2
    assert "run folder not found" in done.stderr and "nope" in done.stderr
    assert tree(tmp_path) == []


def test_replay_needs_the_original_workspace_manifest(run: Path, tmp_path: Path) -> None:
    (run / "workspace_manifest.json").unlink()
    before = tree(tmp_path)
    done = reroll("replay", str(run), cwd=tmp_path)
    assert done.returncode == 2
    assert "workspace_manifest.json: missing" in done.stderr
    assert tree(tmp_path) == before


def test_replay_corrupt_workspace_manifest(run: Path, tmp_path: Path) -> None:
    (run / "workspace_manifest.json").write_text("[1, 2")
    before = tree(tmp_path)
    done = reroll("replay", str(run), cwd=tmp_path)
    assert done.returncode == 2
    assert "workspace_manifest.json: invalid JSON" in done.stderr
    assert tree(tmp_path) == before


def test_branch_unknown_model(run: Path, tmp_path: Path) -> None:
    before = tree(tmp_path)
    done = reroll("branch", str(run), "--at", "1", "--model", "scripted", "--model", "acme/x", cwd=tmp_path)
    assert done.returncode == 2
    assert "model 'acme/x': unknown provider 'acme'" in done.stderr
    assert tree(tmp_path) == before


def test_branch_missing_scripted_model_file(run: Path, tmp_path: Path) -> None:
    before = tree(tmp_path)
    done = reroll("branch", str(run), "--at", "1", "--model", "scripted:no/such.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert "script file no/such.yaml not found" in done.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at", "1"], "Missing option '--model'"),
        (["--model", "scripted"], "branch needs a checkpoint: --at K (or K1,K2,…), --every N or --at-ask N"),
        (["--at", "0,1,5", "--model", "scripted"], "--at 5 is out of range: the run has 2 recorded"),
        (
            ["--at", "1", "--model", "scripted", "--prompt", "hi"],
            "--prompt needs a cut at the start of a turn",
        ),
        (
            ["--at", "1", "--model", "scripted", "-n", "0"],
            "'-n' / '--n': Input should be greater than or equal to 1",
        ),
        (
            ["--at", "1", "--model", "scripted", "--concurrency", "0"],
            "'--concurrency': Input should be greater",
        ),
        (["--at", "1", "--model", "scripted", "--executor", "dask"], "unknown executor 'dask'"),
        (
            ["--at", "1", "--model", "scripted", "--max-starting", "0"],
            "invalid runner flags: 1 validation error for RunnerOptions max_starting",
        ),
    ],
)
def test_branch_usage_errors(run: Path, tmp_path: Path, args: list[str], message: str) -> None:
    before = tree(tmp_path)
    done = reroll("branch", str(run), *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in flat(done.stderr)
    assert tree(tmp_path) == before


def test_branch_of_an_agent_without_a_model(run: Path, tmp_path: Path, examples: Path) -> None:
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "oracle"}
    (run / "config.json").write_text(json.dumps(config))
    before = tree(tmp_path)
    done = reroll("branch", str(run), "--at", "1", "--model", "scripted", cwd=tmp_path)
    assert done.returncode == 2
    assert "agent 'oracle' calls no model; nothing to branch" in done.stderr
    assert tree(tmp_path) == before


def test_continue_a_run_whose_model_is_unavailable_here(run: Path, tmp_path: Path, examples: Path) -> None:
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "acme/m1"}
    (run / "config.json").write_text(json.dumps(config))
    before = tree(tmp_path)
    done = reroll("continue", str(run), "--at", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert "model 'acme/m1': unknown provider 'acme'" in done.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize(("models", "n"), [([], 1), (["scripted"], 0)])
async def test_branch_api_refuses_bad_arguments_with_a_config_error(
    run: Path, tmp_path: Path, models: list[str], n: int
) -> None:
    """The Python API's own check (the CLI's options stop these first): a `ConfigError`, no ValueError."""
    before = tree(tmp_path)
    with pytest.raises(ConfigError, match=r"branch needs models .* and n >= 1"):
        await branch(run, at=1, models=models, n=n)
    assert tree(tmp_path) == before
