"""Jobs with real rollouts: the oracle agent in the local sandbox (real sidecar subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from reroll.errors import AgentError, JobError
from reroll.jobfile import JobSpec, load_job_file
from reroll.jobs import plan_rollouts, run_job
from reroll.sandbox import base
from rich.console import Console

from tests.controller import flaky_sandbox

REROLL = str(Path(sys.executable).parent / "reroll")


def quiet() -> Console:
    return Console(quiet=True)


def write_task(root: Path, name: str, solve: str) -> Path:
    """A native task whose oracle runs `solve` and whose verifier always gives reward 1."""
    task = root / name
    (task / "oracle").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.md").write_text(f"---\nname: {name}\n---\nDo it.\n")
    (task / "oracle" / "solve.sh").write_text(f"#!/bin/sh\n{solve}\n")
    (task / "verifier" / "test.sh").write_text(
        '#!/bin/sh\nmkdir -p "$REROLL_LOGS_DIR/verifier"\necho 1 > "$REROLL_LOGS_DIR/verifier/reward.txt"\n'
    )
    return task


def test_job_file_errors_name_the_file(tmp_path: Path, examples: Path) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\nconcurency: 3\n")
    with pytest.raises(JobError, match=r"job\.yaml: invalid job:(.|\n)*concurency(.|\n)*Extra inputs"):
        load_job_file(file)
    file.write_text("- just\n- a list\n")
    with pytest.raises(JobError, match=r"job\.yaml: a job file is a mapping"):
        load_job_file(file)
    file.write_text("tasks: [unclosed\n")
    with pytest.raises(JobError, match=r"job\.yaml: not valid YAML"):
        load_job_file(file)
    with pytest.raises(JobError, match=r"nope\.yaml: cannot read the job file"):
        load_job_file(tmp_path / "nope.yaml")
    file.write_text("tasks: [hello]\nagents: [oracle]\nrepeats: 0\n")
    with pytest.raises(JobError, match=r"repeats(.|\n)*greater than or equal to 1"):
        load_job_file(file)


def test_plan_expands_and_validates(tmp_path: Path, examples: Path) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(
        "tasks: [hello-file, word-count]\nagents: [oracle, mini-swe-agent]\nmodels: [scripted]\nrepeats: 2\n"
    )
    (tmp_path / "hello-file").symlink_to(examples / "hello-file")
    (tmp_path / "word-count").symlink_to(examples / "word-count")
    planned = plan_rollouts(load_job_file(file))
    assert len(planned) == 2 * 2 * 2
    assert planned[0].name == "hello-file__oracle__no-model__r1"
    assert planned[2].name == "hello-file__mini-swe-agent__scripted__r1"
    assert len({p.name for p in planned}) == len(planned)
    with pytest.raises(AgentError, match="unknown agent 'nobody'"):
        plan_rollouts(JobSpec(tasks=[examples / "hello-file"], agents=["nobody"]))
    with pytest.raises(JobError, match="calls a model"):
        plan_rollouts(JobSpec(tasks=[examples / "hello-file"], agents=["mini-swe-agent"]))
    with pytest.raises(JobError, match="unknown sandbox backend 'moon'"):
        plan_rollouts(JobSpec(tasks=[examples / "hello-file"], agents=["oracle"], sandbox="moon"))


async def test_job_runs_summarises_and_resumes(tmp_path: Path, examples: Path) -> None:
    spec = JobSpec(
        name="j",
        tasks=[examples / "hello-file", examples / "word-count"],
        agents=["oracle"],
        repeats=2,
        concurrency=3,
    )
    summary = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    job_dir = tmp_path / "j"
    assert summary.totals.status_counts == {"ok": 4}
    assert summary.totals.reward_means == {"cases_passed": 2.0, "reward": 1.0}
    assert [r.attempts for r in summary.rollouts] == [1, 1, 1, 1]
    saved = json.loads((job_dir / "summary.json").read_text())
    assert saved["totals"]["rollouts"] == 4 and saved["job"] == "j"
    assert json.loads((job_dir / "job.json").read_text())["repeats"] == 2

    # An interrupted rollout: its folder has no complete result.json. Resume runs only that one.
    interrupted = job_dir / "word-count__oracle__no-model__r2"
    (interrupted / "result.json").unlink()
    resumed = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    attempts = {r.name: r.attempts for r in resumed.rollouts}
    assert attempts == {
        "hello-file__oracle__no-model__r1": 0,
        "hello-file__oracle__no-model__r2": 0,
        "word-count__oracle__no-model__r1": 0,
        "word-count__oracle__no-model__r2": 1,
    }
    assert resumed.totals.status_counts == {"ok": 4}
    assert (job_dir / "_attempts" / "word-count__oracle__no-model__r2.interrupted").is_dir()


async def test_infrastructure_failures_are_retried_with_backoff(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(base.BACKENDS, "flaky", "tests.controller.flaky_sandbox:FlakySandbox")
    monkeypatch.setitem(flaky_sandbox.FAILURES_LEFT, "starts", 2)
    spec = JobSpec(
        name="r",
        tasks=[examples / "hello-file"],
        agents=["oracle"],
        sandbox="flaky",
        max_retries=3,
        retry_backoff_seconds=0.2,
    )
    started = time.monotonic()
    summary = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    (rollout,) = summary.rollouts
    assert rollout.status == "ok" and rollout.attempts == 3
    assert len(rollout.retried_errors) == 2 and "injected start failure" in rollout.retried_errors[0]
    assert time.monotonic() - started >= 0.2 + 0.4  # backoff 0.2 s, then 0.4 s
    aside = sorted(p.name for p in (tmp_path / "r" / "_attempts").iterdir())
    assert aside == ["hello-file__oracle__no-model__r1.attempt1", "hello-file__oracle__no-model__r1.attempt2"]
    failed = json.loads((tmp_path / "r" / "_attempts" / aside[0] / "result.json").read_text())
    assert failed["error_category"] == "infrastructure" and "injected start failure" in failed["error"]

    # Out of retries: the last attempt's error stands.
    monkeypatch.setitem(flaky_sandbox.FAILURES_LEFT, "starts", 5)
    spec = spec.model_copy(update={"name": "r2", "max_retries": 1, "retry_backoff_seconds": 0})
    (rollout,) = (await run_job(spec, jobs_dir=tmp_path, console=quiet())).rollouts
    assert rollout.status == "error" and rollout.attempts == 2
    assert rollout.error_category == "infrastructure"


async def test_agent_errors_and_timeouts_are_not_retried(tmp_path: Path) -> None:
    failing = write_task(tmp_path / "tasks", "failing", "exit 3")
    slow = write_task(tmp_path / "tasks", "slow", "sleep 30")
    spec = JobSpec(
        name="n", tasks=[failing, slow], agents=["oracle"], timeout_seconds=1, retry_backoff_seconds=0
    )
    summary = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    by_task = {r.task: r for r in summary.rollouts}
    assert by_task["failing"].status == "error" and by_task["failing"].error_category == "agent_error"
    assert by_task["slow"].status == "timeout"
    assert by_task["failing"].attempts == by_task["slow"].attempts == 1
    assert not (tmp_path / "n" / "_attempts").exists()


def test_cli_job_file_and_exit_codes(tmp_path: Path, examples: Path) -> None:
    file = tmp_path / "job.yaml"
    file.write_text(f"name: cli\ntasks: [{examples / 'hello-file'}]\nagents: [oracle]\n")
    done = subprocess.run(
        [REROLL, "job", str(file), "--repeats", "2", "--concurrency", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "ok 2 · timeout 0 · error 0" in done.stdout and "summary:" in done.stdout
    again = subprocess.run(
        [REROLL, "job", "--resume", "jobs/cli"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert again.returncode == 0, again.stderr
    summary = json.loads((tmp_path / "jobs" / "cli" / "summary.json").read_text())
    assert [r["attempts"] for r in summary["rollouts"]] == [0, 0]
    file.write_text("tasks: [x]\nagents: [oracle]\nbogus: 1\n")
    bad = subprocess.run([REROLL, "job", str(file)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "job.yaml: invalid job" in bad.stderr and "bogus" in bad.stderr


@pytest.mark.slow
def test_continue_all_finishes_every_timed_out_rollout(tmp_path: Path, examples: Path) -> None:
    """mini-swe-agent times out twice on a script that stalls at turn 3; `continue --all` with the
    bundled script finishes both."""
    script = yaml.safe_load((examples / "fix-failing-test" / "scripted-model.yaml").read_text())
    script["turns"][2]["delay_seconds"] = 3600
    stalling = tmp_path / "stall-at-turn-3.yaml"
    stalling.write_text(yaml.safe_dump(script))
    done = subprocess.run(
        [
            REROLL,
            "job",
            "--task",
            str(examples / "fix-failing-test"),
            "--agent",
            "mini-swe-agent",
            "--model",
            f"scripted:{stalling}",
            "--timeout",
            "40",
            "--repeats",
            "2",
            "--job-name",
            "mswea",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_dir = tmp_path / "jobs" / "mswea"
    recorded = json.loads((job_dir / "summary.json").read_text())
    assert recorded["totals"]["status_counts"] == {"timeout": 2}
    assert recorded["totals"]["exchanges"] == 4 and recorded["totals"]["tokens"] > 0
    continued = subprocess.run(
        [
            REROLL,
            "continue",
            str(job_dir),
            "--all",
            "--model",
            "scripted",
            "--timeout",
            "120",
            "--concurrency",
            "2",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert continued.returncode == 0, continued.stdout + continued.stderr
    summary = json.loads((job_dir / "continued" / "summary.json").read_text())
    assert summary["totals"]["status_counts"] == {"ok": 2}
    assert summary["totals"]["reward_means"] == {"reward": 1.0}
    for rollout in summary["rollouts"]:
        config = json.loads((job_dir / "continued" / rollout["name"] / "config.json").read_text())
        assert config["continued_from"]["path"] == str((job_dir / rollout["name"]).resolve())
        assert rollout["exchanges"] == 5


def test_cli_usage_errors(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)

    (tmp_path / "empty").mkdir()
    done = run("continue", "empty", "--all")
    assert done.returncode == 2 and "no run folders" in done.stderr
    done = run("continue", "empty", "--all", "--output", "x")
    assert done.returncode == 2 and "--all continues into JOB_DIR/continued" in done.stderr
    done = run("job", "job.yaml", "--resume", "empty")
    assert done.returncode == 2 and "not both" in done.stderr
    done = run("job", "--resume", "empty")
    assert done.returncode == 2 and "job.json: missing" in done.stderr
