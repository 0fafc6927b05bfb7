"""``--executor ray`` against a local Ray instance on this machine (2 logical CPUs).

The same job runs on the asyncio and the Ray executor and must give the same summary; resume
and the executor-lost retry work under Ray as they do in-process.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from reroll.agents import AGENTS_FILE_ENV, registry
from reroll.jobs.executors import Attempt, RecordedTask, attempt_reads
from reroll.jobs.folder_archive import pack
from reroll.jobs.jobfile import JobSpec, RunnerOptions
from reroll.jobs.runner import continue_job, run_job
from reroll.rollout.commands.continue_ import continue_run
from reroll.rollout.commands.record import run_task
from reroll.runfolder.run import TRAJECTORY, StoreUse
from reroll.runfolder.summary import JobSummary
from reroll.settings import RolloutSettings
from rich.console import Console

from tests.jobs.test_runner import write_task

pytestmark = pytest.mark.spawns  # every test starts Ray and sandboxes

pytest.importorskip("ray", reason="ray is not installed: pip install 'reroll[ray]' (in the dev extra)")

REROLL = str(Path(sys.executable).parent / "reroll")


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """A local Ray instance (2 logical CPUs: the largest concurrency here) for this module's jobs.

    A job on the ray executor joins an instance already running (`reroll.jobs.ray_executor.
    RayExecutor` starts one only when none is, and shuts down only the one it started), so the
    jobs here share one start (20 to 30 s on a loaded 2-core machine) instead of paying it each.
    Its workers were started before any test's environment changes, so what a job needs on a
    worker must travel with it, as on a remote node. The executor's own start and shutdown of a
    local instance are exercised by ``reroll job --executor ray`` in a subprocess
    (`test_lost_ray_worker_is_retried_from_the_cli`), and in process by the single Ray job of
    tests/jobs/test_branch.py and tests/jobs/test_learning.py. Module-scoped: an idle instance
    costs ~5 % of a core and ~0.8 GB for as long as it lives.
    """
    import ray

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        yield
    finally:
        ray.shutdown()


def comparable(summary: JobSummary) -> dict[str, Any]:
    """The summary without what differs between any two runs (paths, times)."""
    fields = ("name", "task", "agent", "model", "status", "error_category", "rewards", "attempts")
    return {
        "rollouts": [r.model_dump(include={*fields, "exchanges", "tokens"}) for r in summary.rollouts],
        "totals": summary.totals.model_dump(),
    }


@pytest.mark.slow
@pytest.mark.usefixtures("ray_instance")
async def test_ray_job_gives_the_same_summary_and_resumes(tmp_path: Path, examples: Path) -> None:
    """2 tasks x (oracle, mini-swe-agent on the scripted model), on both executors."""
    spec = JobSpec(
        tasks=[examples / "hello-file", examples / "word-count"],
        agents=["oracle", "mini-swe-agent"],
        models=["scripted"],
        concurrency=2,
    )
    in_process = await run_job(
        spec.model_copy(update={"name": "local"}), jobs_dir=tmp_path, console=Console(quiet=True)
    )
    ray_spec = spec.model_copy(update={"name": "ray", "executor": "ray"})
    on_ray = await run_job(ray_spec, jobs_dir=tmp_path, console=Console(quiet=True))
    assert comparable(on_ray) == comparable(in_process)
    assert on_ray.totals.status_counts == {"ok": 4}
    assert on_ray.totals.exchanges > 0 and on_ray.totals.tokens > 0
    # (That rollouts really run in Ray workers is shown by the lost-worker test below.)
    saved = json.loads((tmp_path / "ray" / "job.json").read_text())
    assert saved["executor"] == "ray"

    # Resume under Ray: only the rollout without a complete result.json runs again.
    (tmp_path / "ray" / "word-count__oracle__no-model__r1" / "result.json").unlink()
    resumed = await run_job(ray_spec, jobs_dir=tmp_path, console=Console(quiet=True))
    attempts = {r.name: r.attempts for r in resumed.rollouts}
    assert attempts["word-count__oracle__no-model__r1"] == 1
    assert sum(attempts.values()) == 1
    assert resumed.totals.status_counts == {"ok": 4}


@pytest.mark.slow
def test_lost_ray_worker_is_retried_from_the_cli(tmp_path: Path) -> None:
    """The first attempt's oracle SIGKILLs its Ray worker: Ray loses the task, the job retries it.
    (On `local-plain`: the isolated `local` sandbox's PID namespace hides the worker from it.)"""
    marker = tmp_path / "killed-once"
    task = write_task(
        tmp_path / "tasks",
        "kill-worker",
        # Walk up the ancestors to the Ray worker (its title starts with ray::) and kill it.
        f"if [ ! -e {marker} ]; then touch {marker}; pid=$$; while [ $pid -gt 1 ]; do "
        "if tr '\\0' ' ' < /proc/$pid/cmdline | grep -q '^ray::'; then kill -9 $pid; fi; "
        "pid=$(awk '{print $4}' /proc/$pid/stat); done; sleep 30; fi",
    )
    done = subprocess.run(
        [
            *(REROLL, "job", "--task", str(task), "--agent", "oracle", "--executor", "ray"),
            *("--job-name", "k", "--concurrency", "1", "--max-retries", "1", "--sandbox", "local-plain"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "jobs" / "k" / "summary.json").read_text())
    (rollout,) = summary["rollouts"]
    assert rollout["status"] == "ok" and rollout["attempts"] == 2
    assert "Ray lost the task" in rollout["retried_errors"][0]
    # The lost attempt's run folder was on the worker: none of it came back to set aside.
    assert not (tmp_path / "jobs" / "k" / "_attempts").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("ray_instance")
async def test_continue_job_on_ray_reraises_errors_from_the_task(tmp_path: Path) -> None:
    """``continue-job`` on Ray: an error raised inside the Ray task (here: the timed-out run's
    recorded trajectory is gone) ends the rollout as it does in-process, unwrapped."""
    task = write_task(tmp_path / "tasks", "slow", "sleep 60")
    spec = JobSpec(name="c", tasks=[task], agents=["oracle"], timeout_seconds=1)
    first = await run_job(spec, jobs_dir=tmp_path, console=Console(quiet=True))
    assert first.totals.status_counts == {"timeout": 1}
    for trajectory in (tmp_path / "c").glob(f"*/{TRAJECTORY}"):
        trajectory.unlink()  # an oracle's run has an empty one; without it there is nothing to replay
    summaries = [
        await continue_job(
            tmp_path / "c",
            console=Console(quiet=True),
            runner=RunnerOptions(concurrency=1, executor=executor),
        )
        for executor in ("asyncio", "ray")
    ]
    assert comparable(summaries[1]) == comparable(summaries[0])
    (rollout,) = summaries[1].rollouts
    assert rollout.error_category == "config" and rollout.attempts == 1
    assert rollout.error is not None and "llm_trajectory.jsonl: missing" in rollout.error


def test_an_attempt_is_relocated_to_the_worker() -> None:
    """On a worker, paths inside a folder the attempt reads point into the worker's copy, the run
    folder and its parents into the scratch folder, ``tasks_dir`` to the worker's; others stay."""
    from reroll.jobs.ray_executor import relocated

    new = Attempt(
        Path("/home/u/jobs/j/hello__r1"),
        partial(run_task, Path("/home/u/tasks/hello"), jobs_dir=Path("/home/u/jobs"), job_name="j"),
        reads=(Path("/home/u/tasks/hello"),),
    )
    worker = relocated(new, {Path("/home/u/tasks/hello"): Path("/cache/f/abc")}, Path("/scratch"), None)
    assert worker.run_dir == Path("/scratch/home/u/jobs/j/hello__r1")
    assert isinstance(worker.run, partial)
    assert worker.run.args == (Path("/cache/f/abc"),)
    assert worker.run.keywords == {"jobs_dir": Path("/scratch/home/u/jobs"), "job_name": "j"}

    continued = Attempt(
        Path("/jobs/j/continued/r1"),
        partial(continue_run, Path("/jobs/j/r1"), tasks_dir=Path("/tasks"), output=Path("/jobs/j/continued")),
        reads=(Path("/jobs/j/r1"),),
    )
    worker = relocated(continued, {Path("/jobs/j/r1"): Path("/cache/f/def")}, Path("/s"), Path("/s/tasks"))
    assert isinstance(worker.run, partial)
    assert worker.run.args == (Path("/cache/f/def"),)
    assert worker.run.keywords == {"tasks_dir": Path("/s/tasks"), "output": Path("/s/jobs/j/continued")}
    with_task = dataclasses.replace(continued, recorded_task=RecordedTask("t", Path("/tasks/t")))
    assert with_task.folders_read == (Path("/jobs/j/r1"), Path("/tasks/t"))  # its task travels too
    unshipped = relocated(continued, {}, Path("/s"), None)  # the recorded run could not be packed
    assert isinstance(unshipped.run, partial)
    assert unshipped.run.args == (Path("/jobs/j/r1"),) and unshipped.run.keywords["tasks_dir"] == Path(
        "/tasks"
    )


def test_the_paths_of_an_attempt_s_options_and_model_are_relocated_too() -> None:
    """The skills folder, the learner store and a judge's and a model's script file are carried
    to the worker like the task folder: each is one of the attempt's reads, rebound there."""
    from reroll.jobs.ray_executor import relocated

    options = RolloutSettings(
        skill_mode="with-skill",
        skills_dir=Path("/home/u/skills"),
        learner_store=StoreUse(path="/jobs/j/store", generation=2, writes_back=False),
        judge_model="scripted:/home/u/judge.yaml",
    )
    call = partial(run_task, Path("/t/hello"), model="scripted-chat:/home/u/fast.yaml", options=options)
    reads = attempt_reads(Path("/t/hello"), options=options, model="scripted-chat:/home/u/fast.yaml")
    assert reads == tuple(
        map(Path, ("/t/hello", "/home/u/skills", "/jobs/j/store", "/home/u/judge.yaml", "/home/u/fast.yaml"))
    )
    worker = relocated(
        Attempt(Path("/jobs/j/hello__r1"), call, reads=reads),
        {path: Path(f"/cache/{index}") for index, path in enumerate(reads)},
        Path("/s"),
        None,
    )
    assert isinstance(worker.run, partial)
    moved = worker.run.keywords["options"]
    assert moved.skills_dir == Path("/cache/1")
    assert moved.learner_store == StoreUse(path="/cache/2", generation=2, writes_back=False)
    assert moved.judge_model == "scripted:/cache/3"
    assert worker.run.keywords["model"] == "scripted-chat:/cache/4"
    unshipped = {"skills_dir": None, "learner_store": None, "judge_model": None}
    assert moved.model_copy(update=unshipped) == options.model_copy(update=unshipped)


def test_config_json_comes_back_with_the_controller_s_paths(tmp_path: Path) -> None:
    """The run folder names the task, skills and script as they are on the controller, not in the
    worker's cache (so ``reroll continue`` of it finds them there); other values are untouched."""
    from reroll.jobs.ray_executor import restore_paths

    cache, scratch = "/w/.cache/reroll/ray/folders/" + "a" * 64, tmp_path / "scratch"
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "task_path": f"{cache}/",
                "effective_skills_dir": f"{cache}/environment/skills",
                "model": f"scripted:{cache}/fast.yaml",
                "branched_from": {"path": f"{scratch}/jobs/j/branched/r1"},
                "skills": {"greeting": "b" * 64},
                "timeout_sec": 30,
                "notes": [f"{cache}", None],
            }
        )
    )
    restore_paths(config, {Path("/home/u/tasks/t"): Path(cache)}, scratch)
    assert json.loads(config.read_text()) == {
        "task_path": "/home/u/tasks/t/",
        "effective_skills_dir": "/home/u/tasks/t/environment/skills",
        "model": "scripted:/home/u/tasks/t/fast.yaml",
        "branched_from": {"path": "/jobs/j/branched/r1"},
        "skills": {"greeting": "b" * 64},
        "timeout_sec": 30,
        "notes": ["/home/u/tasks/t", None],
    }
    restore_paths(tmp_path / "missing.json", {}, scratch)  # a run that made no config.json
    assert not (tmp_path / "missing.json").exists()


def skills_task(root: Path) -> tuple[Path, Path]:
    """A task whose oracle copies the word of the mounted skill ``greeting`` into answer.txt and
    whose verifier rewards the word, and a skills folder beside it (not in the task folder)."""
    task = write_task(
        root,
        "skill-word",
        'cat "$REROLL_SANDBOX_ROOT/etc/reroll/skills/mounted/greeting/SKILL.md" '
        '> "$REROLL_WORKSPACE/answer.txt"',
    )
    (task / "verifier" / "test.sh").write_text(
        '#!/bin/sh\nmkdir -p "$REROLL_LOGS_DIR/verifier"\n'
        'if grep -q marmalade "$REROLL_WORKSPACE/answer.txt"; then r=1; else r=0; fi\n'
        'echo $r > "$REROLL_LOGS_DIR/verifier/reward.txt"\n'
    )
    skills = root / "skills"
    (skills / "greeting").mkdir(parents=True)
    (skills / "greeting" / "SKILL.md").write_text(
        "---\nname: greeting\ndescription: The word to greet with.\n---\nThe word is marmalade.\n"
    )
    return task, skills


@pytest.mark.slow
@pytest.mark.usefixtures("ray_instance")
async def test_a_skills_dir_travels_to_the_ray_worker(tmp_path: Path) -> None:
    """``--skills with-skill --skills-dir DIR`` on Ray: the folder reaches the worker's cache, the
    oracle reads the skill in its sandbox there, and config.json names the controller's paths."""
    task, skills = skills_task(tmp_path / "in")
    spec = JobSpec(tasks=[task], agents=["oracle"], skills="with-skill", skills_dir=skills, concurrency=1)
    summaries = [
        await run_job(
            spec.model_copy(update={"name": executor, "executor": executor}),
            jobs_dir=tmp_path / "jobs",
            console=Console(quiet=True),
        )
        for executor in ("asyncio", "ray")
    ]
    assert comparable(summaries[1]) == comparable(summaries[0])
    (rollout,) = summaries[1].rollouts
    assert (rollout.status, rollout.rewards) == ("ok", {"reward": 1.0})
    config = json.loads((tmp_path / "jobs" / "ray" / rollout.name / "config.json").read_text())
    assert (config["task_path"], config["effective_skills_dir"]) == (str(task), str(skills))
    assert config["skill_source"] == "custom_runtime" and list(config["skills"]) == ["greeting"]
    from reroll.jobs.ray_executor import worker_root

    assert (worker_root() / "folders" / pack(skills).digest / "greeting" / "SKILL.md").is_file()


def test_the_controller_s_agent_declarations_are_the_worker_s_for_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$REROLL_AGENTS_FILE`` of the controller, carried to the worker, is what the registry reads
    during the task; the worker's own declarations are back after it."""
    from reroll.jobs.ray_executor import _agents_declared_in

    for name in ("own", "carried"):
        (tmp_path / f"{name}.yaml").write_text(
            f"{name}-agent:\n  description: d\n  api_format: none\n  launch: 'true'\n"
        )
    monkeypatch.setenv(AGENTS_FILE_ENV, str(tmp_path / "own.yaml"))
    registry.cache_clear()
    try:
        assert "own-agent" in registry()
        with _agents_declared_in(tmp_path / "carried.yaml"):
            assert "carried-agent" in registry() and "own-agent" not in registry()
        assert "own-agent" in registry() and "carried-agent" not in registry()
        with _agents_declared_in(None):
            assert "own-agent" in registry()
    finally:
        registry.cache_clear()
