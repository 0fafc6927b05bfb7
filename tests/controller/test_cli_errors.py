"""Bad input to the real `reroll` executable: a clear message, exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.controller.test_runfolder import exchange_line, make_run_folder

REROLL = str(Path(sys.executable).parent / "reroll")


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_unknown_agent(tmp_path: Path, examples: Path) -> None:
    done = reroll("run", str(examples / "hello-file"), "--agent", "nope", "--jobs-dir", "jobs", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown agent 'nope'" in done.stderr and "mini-swe-agent" in done.stderr
    assert not (tmp_path / "jobs").exists()


def test_missing_task(tmp_path: Path) -> None:
    done = reroll("run", "no/such/task", "--agent", "oracle", "--jobs-dir", "jobs", cwd=tmp_path)
    assert done.returncode == 2
    assert "task not found" in done.stderr and "no/such/task" in done.stderr
    assert not (tmp_path / "jobs").exists()


def test_model_required_for_llm_agents(tmp_path: Path, examples: Path) -> None:
    done = reroll("run", str(examples / "hello-file"), "--agent", "mini-swe-agent", cwd=tmp_path)
    assert done.returncode == 2
    assert "--model" in done.stderr


def test_continue_missing_config(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    (folder / "config.json").unlink()
    before = tree(tmp_path)
    done = reroll("continue", str(folder), cwd=tmp_path)
    assert done.returncode == 2
    assert "config.json: missing" in done.stderr
    assert tree(tmp_path) == before


def test_continue_corrupt_trajectory(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0), "garbage", exchange_line(2)])
    before = tree(tmp_path)
    done = reroll("continue", str(folder), cwd=tmp_path)
    assert done.returncode == 2
    assert "llm_trajectory.jsonl" in done.stderr and "line 2" in done.stderr
    assert tree(tmp_path) == before


def test_continue_missing_task(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"status": "timeout"})
    before = tree(tmp_path)
    done = reroll("continue", str(folder), "--tasks-dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert "task 't' not found" in done.stderr
    assert tree(tmp_path) == before


def test_require_timeout_refuses_finished_runs(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"status": "ok"})
    done = reroll("continue", str(folder), "--require-timeout", cwd=tmp_path)
    assert done.returncode == 2
    assert "not 'timeout'" in done.stderr


def test_network_none_needs_a_container_backend(tmp_path: Path, examples: Path) -> None:
    done = reroll(
        "run",
        str(examples / "hello-file"),
        "--agent",
        "oracle",
        "--network",
        "none",
        "--jobs-dir",
        "jobs",
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "--network none needs --sandbox docker" in done.stderr
    assert not (tmp_path / "jobs").exists()
    job = reroll(
        "job", "--task", str(examples / "hello-file"), "--agent", "oracle", "--network", "none", cwd=tmp_path
    )
    assert job.returncode == 2 and "network none needs sandbox docker" in job.stderr
