"""Bad input to the real `reroll` executable: a clear message, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.runfolder.store import create_store

from tests.runfolder.test_run import exchange_line, make_run_folder

pytestmark = pytest.mark.spawns  # every test runs the reroll CLI as a subprocess

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


def test_network_none_needs_a_backend_with_a_network_policy(tmp_path: Path, examples: Path) -> None:
    refused = ("--agent", "oracle", "--network", "none", "--sandbox", "local-plain")
    done = reroll("run", str(examples / "hello-file"), *refused, "--jobs-dir", "jobs", cwd=tmp_path)
    assert done.returncode == 2
    assert "--network none needs --sandbox local or docker: the local-plain sandbox" in done.stderr
    assert not (tmp_path / "jobs").exists()
    job = reroll("job", "--task", str(examples / "hello-file"), *refused, cwd=tmp_path)
    assert job.returncode == 2 and "network none needs sandbox local or docker" in job.stderr


def timed_out(path: Path, config: dict[str, str]) -> Path:
    """A timed-out run folder of one exchange, with `config` as its config.json."""
    folder = make_run_folder(path, [exchange_line(0)], result={"status": "timeout"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_unknown_sandbox_backend(tmp_path: Path, examples: Path) -> None:
    """A typo in --sandbox is bad input (exit 2, nothing written), not a sandbox failure to retry."""
    task = str(examples / "hello-file")
    run = ["run", task, "--agent", "oracle", "--sandbox", "dockr", "--jobs-dir", "jobs"]
    done = reroll(*run, cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown sandbox backend 'dockr'; known: docker, local" in done.stderr
    assert not (tmp_path / "jobs").exists()
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    folder = timed_out(tmp_path / "run", config)
    (folder / "workspace_manifest.json").write_text("{}")  # what replay compares with
    before = tree(tmp_path)
    for command in (["continue"], ["replay"], ["branch", "--at", "1", "--model", "scripted"]):
        done = reroll(command[0], str(folder), *command[1:], "--sandbox", "dockr", cwd=tmp_path)
        assert done.returncode == 2 and "unknown sandbox backend 'dockr'" in done.stderr, command
    done = reroll("continue-job", str(tmp_path), "--sandbox", "dockr", cwd=tmp_path)
    assert done.returncode == 2 and "unknown sandbox backend 'dockr'" in done.stderr
    assert tree(tmp_path) == before


def test_missing_provider_key(tmp_path: Path, examples: Path) -> None:
    """Refused before anything is written (exit 2), by run, job, continue and continue-job alike."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "REROLL_UPSTREAM_URL")}
    task = str(examples / "hello-file")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [REROLL, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
        )

    for command in (["run", task], ["job", "--task", task]):
        done = run(*command, "--agent", "mini-swe-agent", "--model", "openai/gpt-4o", "--jobs-dir", "jobs")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "model 'openai/gpt-4o' needs OPENAI_API_KEY in the environment" in done.stderr
        assert not (tmp_path / "jobs").exists()
    folder = timed_out(
        tmp_path / "run", {"task_path": task, "agent": "mini-swe-agent", "model": "openai/gpt-4o"}
    )
    before = tree(tmp_path)
    done = run("continue", str(folder))
    assert done.returncode == 2 and "needs OPENAI_API_KEY" in done.stderr
    done = run("continue-job", str(tmp_path), "--model", "openai/gpt-4o")
    assert done.returncode == 2 and "needs OPENAI_API_KEY" in done.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("command", ["run", "job"])
def test_an_image_map_item_that_is_not_src_eq_dst_is_refused(
    tmp_path: Path, examples: Path, command: str
) -> None:
    args = [str(examples / "hello-file")] if command == "run" else ["--task", str(examples / "hello-file")]
    done = reroll(command, *args, "--agent", "oracle", "--image-map", "ubuntu:24.04", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'ubuntu:24.04' must be SRC=DST" in done.stdout + done.stderr
    assert tree(tmp_path) == []


def test_continue_of_a_symlink_loop_exits_2_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "run").symlink_to(tmp_path / "run")
    done = reroll("continue", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert (
        f"run folder {tmp_path / 'run'}: cannot be resolved" in done.stderr and "Traceback" not in done.stderr
    )


def test_trial_refusals_name_the_cause_and_write_nothing(tmp_path: Path, examples: Path) -> None:
    trial = tmp_path / "trial.yaml"
    trial.write_text(
        f"task: {examples / 'hello-file'}\nscenes:\n  - roles: [{{name: a}}]\n"
        "    turns: [{role: a}, {role: a, prompt: more, resume: true}]\n"
    )
    done = reroll("run", "--trial", str(trial), "--agent", "mini-swe-agent", "--model", "scripted",
                  "--jobs-dir", "jobs", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "mini-swe-agent, which has no session to resume" in done.stderr
    done = reroll("run", "--trial", str(tmp_path / "missing.yaml"), "--jobs-dir", "jobs", cwd=tmp_path)
    assert done.returncode == 2 and "missing.yaml: cannot read the trial file" in done.stderr
    done = reroll("run", "--agent", "oracle", "--jobs-dir", "jobs", cwd=tmp_path)
    assert done.returncode == 2 and "no task" in done.stderr
    trial.write_text("scenes: [{roles: [{name: a}], turns: [{role: a}]}]\n")
    done = reroll(
        "run", str(examples / "hello-file"), "--trial", str(trial), "--jobs-dir", "jobs", cwd=tmp_path
    )
    assert done.returncode == 2 and "role 'a': no agent" in done.stderr
    assert not (tmp_path / "jobs").exists()


def test_store_commands_on_bad_stores(tmp_path: Path) -> None:
    """A job without a store, a missing generation, a corrupt generation manifest: exit 2, the file
    named, nothing changed."""
    job = tmp_path / "job"
    job.mkdir()
    done = reroll("store", "rollback", str(job), "0", cwd=tmp_path)
    assert done.returncode == 2
    assert "job/store/head.json: missing" in done.stderr and "no learner store" in done.stderr
    create_store(job / "store")
    before = {p: p.read_bytes() for p in (job / "store").rglob("*") if p.is_file()}
    done = reroll("store", "rollback", str(job), "3", cwd=tmp_path)
    assert done.returncode == 2 and "generations/3.json: missing" in done.stderr
    done = reroll("store", "diff", str(job), "0", "3", cwd=tmp_path)
    assert done.returncode == 2 and "the store has no generation 3 (it has 0)" in done.stderr
    assert {p: p.read_bytes() for p in (job / "store").rglob("*") if p.is_file()} == before
    (job / "store" / "generations" / "0.json").write_text('{"number": 0}')
    done = reroll("store", "log", str(job), cwd=tmp_path)
    assert done.returncode == 2
    assert "generations/0.json: corrupt" in done.stderr and "created_at" in done.stderr


def test_continue_job_refuses_a_user_model_it_cannot_run(tmp_path: Path, examples: Path) -> None:
    """``continue-job --user-model`` (as continue's, run's and branch's) is checked before anything
    is written: a missing script is named, exit 2."""
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    timed_out(tmp_path / "job" / "run", config)
    before = tree(tmp_path)
    missing = tmp_path / "no-such-user.yaml"
    done = reroll("continue-job", str(tmp_path / "job"), "--user-model", f"scripted:{missing}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert str(missing) in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("ray_address", [None, "ray://10.0.0.9:10001"])
def test_ray_that_does_not_start_is_a_clear_error_without_a_traceback(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch, ray_address: str | None
) -> None:
    """``ray.init`` raising a bare Exception (what Ray raises when its node times out during
    start-up) ends the job with exit 1 and one line naming the cause and $RAY_ADDRESS."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'reroll[ray]'")
    from reroll.cli.app import app
    from typer.testing import CliRunner

    def timed_out(**_: object) -> None:
        raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", timed_out)
    monkeypatch.chdir(tmp_path)
    env = {"RAY_ADDRESS": ray_address} if ray_address else {}
    if not ray_address:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = ["job", "--task", str(examples / "hello-file"), "--agent", "oracle", "--executor", "ray"]
    done = CliRunner().invoke(app, args, env={"COLUMNS": "300", **env})
    message = " ".join(done.stderr.split())
    assert done.exit_code == 1, done.output
    assert isinstance(done.exception, SystemExit), done.exception  # refused, not raised
    assert "Traceback" not in done.stderr
    assert "The current node timed out during startup" in message
    if ray_address:
        assert f"cannot join the Ray cluster at {ray_address} (RAY_ADDRESS={ray_address})" in message
    else:
        assert "cannot start a local Ray instance: Exception:" in message and "RAY_ADDRESS" not in message


def test_an_unusable_judge_model_is_refused_before_the_agent_runs(tmp_path: Path, examples: Path) -> None:
    """A BenchFlow task's judge ``model: claude-sonnet-4-6`` is Anthropic's: without its key, run
    and job exit 2 naming ANTHROPIC_API_KEY and --judge-model, before the agent runs (nothing
    written); --judge-model with the scripted judge makes the same task run."""
    task = tmp_path / "task"
    shutil.copytree(examples / "release-note", task)
    document = task / "verifier" / "verifier.md"
    document.write_text(
        document.read_text().replace("model: scripted:scripted-judge.yaml", "model: claude-sonnet-4-6")
    )
    hidden = ("ANTHROPIC_API_KEY", "REROLL_UPSTREAM_URL")
    env = {k: v for k, v in os.environ.items() if k not in hidden}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [REROLL, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
        )

    for command in (["run", str(task)], ["job", "--task", str(task)]):
        done = run(*command, "--agent", "oracle", "--jobs-dir", "jobs")
        assert done.returncode == 2, done.stdout + done.stderr
        assert "the judge model 'claude-sonnet-4-6' (the task's verifier model)" in done.stderr
        assert "needs ANTHROPIC_API_KEY" in done.stderr and "--judge-model" in done.stderr
        assert not (tmp_path / "jobs").exists()
    script = examples / "release-note" / "scripted-judge.yaml"
    done = run(
        "run", str(task), "--agent", "oracle", "--jobs-dir", "jobs", "--judge-model", f"scripted:{script}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
