"""Jobs with real rollouts: the oracle agent in the local sandbox (real sidecar subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reroll.jobs.executors import AsyncioExecutor, Attempt
from reroll.jobs.jobfile import JobSpec, RunnerOptions, load_job_file
from reroll.jobs.planning import plan_rollouts
from reroll.jobs.runner import _with_retries, continue_job, refuse_untravelled, run_job
from reroll.rollout.start import RolloutOutcome
from reroll.runfolder.run import RunConfig
from reroll.sandbox import base
from reroll.trials.config import Scene, TrialConfig
from reroll_contracts.errors import AgentError, JobError, ModelError, SandboxBackendError
from rich.console import Console

from tests.jobs import flaky_sandbox
from tests.rollout.verify.test_judge_model import KEYS, UNKEYED_JUDGE, unkeyed_judge_run
from tests.runfolder.test_run import exchange_line, make_run_folder

REROLL = str(Path(sys.executable).parent / "reroll")


def quiet() -> Console:
    return Console(quiet=True)


def write_task(root: Path, name: str, solve: str, agent_timeout_seconds: int = 300) -> Path:
    """A native task whose oracle runs `solve` (for at most `agent_timeout_seconds`) and whose
    verifier always gives reward 1."""
    task = root / name
    (task / "oracle").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.md").write_text(
        f"---\nname: {name}\nagent:\n  timeout_sec: {agent_timeout_seconds}\n---\nDo it.\n"
    )
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
    with pytest.raises(SandboxBackendError, match="unknown sandbox backend 'moon'"):
        plan_rollouts(JobSpec(tasks=[examples / "hello-file"], agents=["oracle"], sandbox="moon"))


def test_plan_refuses_what_each_rollout_would_refuse(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first rollout of each (task, agent) pair is checked before anything runs
    (`check_rollout`): a persona User whose model cannot be used — refused (exit 2), not a job of
    errored rollouts."""
    mail, script = (
        [examples / "mail-calendar"],
        [f"scripted:{examples / 'hello-file' / 'scripted-model.yaml'}"],
    )
    assert len(plan_rollouts(JobSpec(tasks=mail, agents=["mini-swe-agent"], models=script))) == 1  # bridged
    spec = JobSpec(tasks=mail, agents=["mini-swe-agent"], models=script, without_mcp=True)
    assert len(plan_rollouts(spec)) == 1
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    trial = tmp_path / "persona.yaml"
    source = examples.parent / "trials" / "ask-a-persona.yaml"
    trial.write_text(
        source.read_text()
        .replace("../tasks/greet-the-user", str(examples / "greet-the-user"))
        .replace("file: persona/", f"file: {source.parent}/persona/")
        .replace("model: scripted:persona/french-reader.script.yaml", "model: claude-haiku-4-5")
    )
    with pytest.raises(
        ModelError, match=r"the User's model 'claude-haiku-4-5'.*ANTHROPIC_API_KEY.*--user-model"
    ):
        plan_rollouts(
            JobSpec(tasks=[examples / "greet-the-user"], agents=["claude-code"], models=script, trial=trial)
        )


@pytest.mark.spawns
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


@pytest.mark.spawns
async def test_infrastructure_failures_are_retried_with_backoff(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(base.BACKENDS, "flaky", "tests.jobs.flaky_sandbox:FlakySandbox")
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


@pytest.mark.spawns
async def test_agent_errors_and_timeouts_are_not_retried(tmp_path: Path) -> None:
    failing = write_task(
        tmp_path / "tasks", "failing", "exit 3"
    )  # 300 s: a loaded machine cannot time it out
    slow = write_task(tmp_path / "tasks", "slow", "sleep 30", agent_timeout_seconds=1)
    spec = JobSpec(name="n", tasks=[failing, slow], agents=["oracle"], retry_backoff_seconds=0)
    summary = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    by_task = {r.task: r for r in summary.rollouts}
    assert by_task["failing"].status == "error" and by_task["failing"].error_category == "agent_error"
    assert by_task["slow"].status == "timeout"
    assert by_task["failing"].attempts == by_task["slow"].attempts == 1
    assert not (tmp_path / "n" / "_attempts").exists()


async def test_a_rollout_that_raises_a_bug_ends_in_error_and_the_job_still_summarises(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(base.BACKENDS, "broken", "tests.jobs.flaky_sandbox:BrokenSandbox")
    spec = JobSpec(
        name="b",
        tasks=[examples / "hello-file"],
        agents=["oracle"],
        repeats=2,
        sandbox="broken",
        retry_backoff_seconds=0,
    )
    summary = await run_job(spec, jobs_dir=tmp_path, console=quiet())
    assert summary.totals.status_counts == {"error": 2}
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["totals"]["rollouts"] == 2
    for rollout in summary.rollouts:
        assert rollout.error_category == "internal" and rollout.attempts == 1  # a bug is not retried
        folder = tmp_path / "b" / rollout.name
        result = json.loads((folder / "result.json").read_text())
        assert result["status"] == "error" and result["error_category"] == "internal"
        assert "RuntimeError" in result["error"] and "error.txt" in result["error"]
        traceback = (folder / "error.txt").read_text()
        assert "Traceback" in traceback and "a bug in start" in traceback


async def test_an_attempt_that_raises_still_gets_a_summary(tmp_path: Path) -> None:
    """Whatever escapes a rollout (here: before it wrote anything) ends as a summary, not a crash."""

    async def crash(**_: object) -> RolloutOutcome:
        raise ZeroDivisionError("division by zero in the rollout")

    attempt = Attempt(tmp_path / "r", crash)
    summary = await _with_retries(
        AsyncioExecutor(RunnerOptions(concurrency=1, max_starting=1)),
        attempt,
        tmp_path,
        max_retries=2,
        backoff_seconds=0,
        identity=("r", "t", "oracle", None),
    )
    assert (summary.status, summary.error_category, summary.attempts) == ("error", "internal", 1)
    assert summary.error is not None and "ZeroDivisionError" in summary.error and "Traceback" in summary.error


@pytest.mark.spawns
def test_a_failed_agent_install_is_an_agent_error_never_a_class_name(tmp_path: Path, examples: Path) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        "broken-install:\n  description: d\n  api_format: none\n"
        "  install: echo no such package >&2; exit 3\n  launch: 'true'\n"
    )
    done = subprocess.run(
        [REROLL, "job", "--task", str(examples / "hello-file"), "--agent", "broken-install"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "REROLL_AGENTS_FILE": str(agents)},
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    (job,) = (tmp_path / "jobs").iterdir()
    (rollout,) = json.loads((job / "summary.json").read_text())["rollouts"]
    assert rollout["error_category"] == "agent_error" and rollout["attempts"] == 1
    assert "installing broken-install failed" in rollout["error"] and "no such package" in rollout["error"]


@pytest.mark.spawns
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
def test_continue_job_finishes_every_timed_out_rollout(tmp_path: Path, examples: Path) -> None:
    """mini-swe-agent is cut twice by the job's step limit before turn 3; `continue-job` with the
    bundled script finishes both."""
    done = subprocess.run(
        [
            REROLL,
            "job",
            "--task",
            str(examples / "fix-failing-test"),
            "--agent",
            "mini-swe-agent",
            "--model",
            "scripted",
            "--max-steps",
            "2",
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
            "continue-job",
            str(job_dir),
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


async def test_continue_job_summarises_a_run_whose_config_is_corrupt(tmp_path: Path) -> None:
    """A timed-out run whose config.json is not JSON: its continuation ends in error (category
    config, naming the file), not retried, and summary.json is written all the same."""
    job_dir = tmp_path / "job"
    folder = make_run_folder(job_dir / "r1", [exchange_line(0)], result={"status": "timeout"})
    (folder / "config.json").write_text("{not json")
    summary = await continue_job(job_dir, console=quiet(), runner=RunnerOptions(retry_backoff_seconds=0))
    (rollout,) = summary.rollouts
    assert (rollout.name, rollout.task, rollout.status) == ("r1", "unknown", "error")
    assert rollout.error_category == "config" and rollout.attempts == 1
    assert rollout.error is not None and "config.json" in rollout.error
    saved = json.loads((job_dir / "continued" / "summary.json").read_text())
    assert saved["totals"]["status_counts"] == {"error": 1}


async def test_continue_job_refuses_an_unusable_judge_model_before_anything_runs(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed-out run whose task's judge is ``model: claude-sonnet-4-6`` (BenchFlow's form) with no
    ANTHROPIC_API_KEY: the job is refused naming the variable and --judge-model, no continuation
    written — not a job whose every continuation ends in error after its agent ran."""
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)
    unkeyed_judge_run(tmp_path, examples, "timeout", 1)
    with pytest.raises(ModelError, match=UNKEYED_JUDGE):
        await continue_job(tmp_path / "job", console=quiet())
    assert not (tmp_path / "job" / "continued").exists()


async def test_a_sequential_shared_job_is_refused_on_ray_before_anything_is_written(
    tmp_path: Path, examples: Path
) -> None:
    """Its rollouts run one at a time, each from the store generation the one before it left in
    the controller's job folder: refused with the reason, not run."""
    spec = JobSpec(
        name="s",
        tasks=[examples / "hello-file"],
        agents=["oracle"],
        schedule="sequential-shared",
        executor="ray",
    )
    with pytest.raises(
        JobError, match=r"sequential-shared cannot run on the ray executor.*--executor asyncio"
    ):
        await run_job(spec, jobs_dir=tmp_path, console=quiet())
    assert list(tmp_path.iterdir()) == []


def file_user_run(job_dir: Path, user: str) -> Path:
    """A timed-out run of a trial whose scene's User is `user`."""
    folder = make_run_folder(job_dir / "r1", [exchange_line(0)], result={"status": "timeout"})
    config = json.loads((folder / "config.json").read_text())
    trial = TrialConfig(scenes=[Scene.single("mini-swe-agent", user=user, max_rounds=2)])
    (folder / "config.json").write_text(json.dumps(config | {"trial": trial.model_dump(mode="json")}))
    return folder


async def test_continue_job_on_ray_refuses_a_trial_whose_user_is_a_file(tmp_path: Path) -> None:
    """A User file is Python importing what lies beside it: it does not travel to a Ray worker,
    so the continuation is refused before anything is written, naming the run and the User."""
    folder = file_user_run(tmp_path / "job", "/home/u/users.py:disclose")
    message = r"job/r1: its trial's User /home/u/users.py:disclose is a file on this machine.*ray workers"
    with pytest.raises(JobError, match=message):
        await continue_job(tmp_path / "job", console=quiet(), runner=RunnerOptions(executor="ray"))
    assert not (tmp_path / "job" / "continued").exists()
    config = RunConfig.model_validate_json((folder / "config.json").read_bytes())
    refuse_untravelled(config, folder, "asyncio")  # in this process the file is at hand
    importable = file_user_run(tmp_path / "other", "users:disclose")
    refuse_untravelled(
        RunConfig.model_validate_json((importable / "config.json").read_bytes()), importable, "ray"
    )


@pytest.mark.spawns
def test_cli_usage_errors(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=tmp_path, timeout=60)

    (tmp_path / "empty").mkdir()
    done = run("continue-job", "empty")
    assert done.returncode == 2 and "no run folders" in done.stderr
    # Each command has only the flags it honours: the others are usage errors, nothing written.
    for args, flag in [
        (["continue-job", "empty", "--output", "x"], "--output"),
        (["continue-job", "empty", "--at", "1"], "--at"),
        (["continue-job", "empty", "--replay-only"], "--replay-only"),
        (["continue", "empty", "--all"], "--all"),
        (["continue", "empty", "--concurrency", "2"], "--concurrency"),
        (["continue", "empty", "--executor", "ray"], "--executor"),
    ]:
        done = run(*args)
        assert done.returncode == 2 and f"No such option: {flag}" in done.stderr, args
    done = run("continue-job", "empty", "--executor", "dask")
    assert done.returncode == 2 and "unknown executor 'dask'" in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["empty"]
    done = run("job", "job.yaml", "--resume", "empty")
    assert done.returncode == 2 and "not both" in done.stderr
    done = run("job", "--resume", "empty")
    assert done.returncode == 2 and "job.json: missing" in done.stderr


@pytest.mark.spawns
async def test_a_jobs_trial_runs_in_every_rollout(tmp_path: Path, examples: Path) -> None:
    """A job file's ``trial`` (relative to it): each rollout runs its turns, the job's agent
    playing the role that names none."""
    (tmp_path / "two-turns.yaml").write_text(
        "scenes:\n  - name: main\n    roles: [{name: solver}]\n    turns:\n"
        "      - role: solver\n      - role: solver\n        prompt: Check it again.\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(f"name: j\ntasks: [{examples / 'hello-file'}]\nagents: [oracle]\ntrial: two-turns.yaml\n")
    summary = await run_job(load_job_file(job), jobs_dir=tmp_path / "jobs", console=quiet())
    assert summary.totals.status_counts == {"ok": 1}
    run = tmp_path / "jobs" / "j" / "hello-file__oracle__no-model__r1"
    turns = json.loads((run / "trial.json").read_text())["turns"]
    assert [turn["prompt"] for turn in turns][1:] == ["Check it again."]
    assert (
        json.loads((run / "config.json").read_text())["trial"]["scenes"][0]["roles"][0]["agent"] == "oracle"
    )
