"""The job file's backend settings (`JobSpec.sandbox_config`) and fault plan, read with the spec."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from reroll.jobs.jobfile import load_job_file
from reroll.jobs.planning import plan_rollouts
from reroll_contracts.errors import JobError, TaskError


def test_a_job_files_sandbox_config_is_kept_and_the_flags_update_it_key_by_key(
    tmp_path: Path, examples: Path
) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\nsandbox: docker\n"
        "sandbox_config:\n  ready_timeout_seconds: 90\n"
        "  image_map: {ubuntu:24.04: reroll/base:bookworm, 'python:3.12-slim': reroll/base:bookworm}\n"
    )
    spec = load_job_file(job_file, {})
    assert spec.sandbox_config == {
        "ready_timeout_seconds": 90,
        "image_map": {"ubuntu:24.04": "reroll/base:bookworm", "python:3.12-slim": "reroll/base:bookworm"},
    }
    flagged = load_job_file(job_file, {"sandbox_config": {"image_map": {"a": "b"}}})
    assert flagged.sandbox_config == {"ready_timeout_seconds": 90, "image_map": {"a": "b"}}


def test_a_job_files_fault_plan_is_relative_to_the_file(tmp_path: Path, examples: Path) -> None:
    job_file = tmp_path / "sub" / "job.yaml"
    job_file.parent.mkdir()
    job_file.write_text(
        f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\nfaults: plans/f.yaml\nfault_seed: 3\n"
    )
    spec = load_job_file(job_file, {})
    assert spec.faults == tmp_path / "sub" / "plans" / "f.yaml" and spec.fault_seed == 3
    job_file.write_text(f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\nfault_seed: 3\n")
    with pytest.raises(JobError, match="fault_seed needs faults"):
        load_job_file(job_file, {})


def test_a_job_files_skills_dir_is_relative_to_it_and_bad_skill_flags_are_refused(tmp_path: Path) -> None:
    task = Path(__file__).resolve().parents[1] / "rollout" / "skills_task"
    job = tmp_path / "job.yaml"
    job.write_text(f"tasks: [{task}]\nagents: [oracle]\nskills: with-skill\nskills_dir: skills\n")
    (tmp_path / "skills" / "one").mkdir(parents=True)
    (tmp_path / "skills" / "one" / "SKILL.md").write_text("---\nname: one\ndescription: d\n---\n")
    spec = load_job_file(job)
    assert (spec.skills, spec.skills_dir) == ("with-skill", tmp_path / "skills")
    assert len(plan_rollouts(spec)) == 1
    with pytest.raises(TaskError, match="needs --skills with-skill"):
        plan_rollouts(load_job_file(job, {"skills": "no-skill"}))


def test_a_job_file_may_offer_ask_user_and_a_bad_value_names_the_file(tmp_path: Path, examples: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"tasks: [{examples / 'greet-the-user'}]\nagents: [claude-code]\nask_user: true\n")
    assert load_job_file(job_file, {}).ask_user is True
    assert load_job_file(job_file, {"ask_user": False}).ask_user is False  # the flag wins
    job_file.write_text(f"tasks: [{examples / 'greet-the-user'}]\nagents: [claude-code]\nask_user: maybe\n")
    with pytest.raises(JobError, match="ask_user") as caught:
        load_job_file(job_file, {})
    assert str(job_file) in str(caught.value)


def test_a_job_file_sets_every_rollout_setting(tmp_path: Path, examples: Path) -> None:
    """Walks `RolloutSettings`' fields: each one a recording takes (all but the divergence policy
    and the learner store, which a job's schedule sets) has a job-file key, and the file's value
    is what every rollout of the job runs with (`JobSpec.settings`)."""
    from reroll.jobs.jobfile import SETTINGS_KEYS
    from reroll.settings import RolloutSettings

    plan = examples.parent / "faults" / "cut.yaml"
    manifest = tmp_path / "clawsbench.toml"
    manifest.write_text('[environment]\nimage = "x"\n')
    values: dict[str, object] = {
        "timeout_seconds": 12.5,
        "sandbox": "docker",
        "sandbox_config": {"ready_timeout_seconds": 90},
        "network": "none",
        "environment_manifest": str(manifest),
        "environment_services": ["gmail"],
        "faults": str(plan),
        "checkpoint_every": 3,
        "checkpoint_keep": 10,
        "max_steps": 4,
        "skill_mode": "with-skill",
        "skills_dir": str(tmp_path / "skills"),
        "judge_model": "openai/gpt-4o",
        "ask_user": True,
        "without_mcp": True,
        "user_model": "anthropic/claude-x",
    }
    assert set(RolloutSettings.model_fields) - {"divergence_policy", "learner_store", "trust"} == set(values)
    assert set(SETTINGS_KEYS) == set(values)
    for field, value in values.items():
        job_file = tmp_path / "job.yaml"
        job = {"tasks": [str(examples / "hello-file")], "agents": ["oracle"], SETTINGS_KEYS[field]: value}
        job_file.write_bytes(orjson.dumps(job))  # JSON is YAML
        got = load_job_file(job_file, {}).settings()
        assert getattr(got, field) != getattr(RolloutSettings(), field), field
        if field == "faults":
            assert got.faults is not None and got.faults.plan_path == plan
        elif field == "skills_dir":
            assert got.skills_dir == tmp_path / "skills"
        elif field == "environment_manifest":
            assert got.environment_manifest == manifest
        elif field == "environment_services":
            assert got.environment_services == ("gmail",)
        elif field == "sandbox_config":  # parsed by the backend's model: the fields set
            assert got.sandbox_config is not None
            assert got.sandbox_config.model_dump(exclude_unset=True) == value, field
        else:
            assert getattr(got, field) == value, field


def test_a_job_file_names_a_trial_relative_to_it(tmp_path: Path, examples: Path) -> None:
    job_file = tmp_path / "job.yaml"
    trial = examples.parent / "trials" / "multi-turn.yaml"
    job_file.write_text(f"tasks: [{examples / 'hello-file'}]\nagents: [claude-code]\ntrial: {trial}\n")
    spec = load_job_file(job_file, {})
    config = spec.trial_config()
    assert spec.trial == trial and config is not None and len(config.scenes[0].turns) == 2
    job_file.write_text(f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\ntrial: missing.yaml\n")
    assert load_job_file(job_file, {}).trial == tmp_path / "missing.yaml"


def test_a_jobs_trial_runs_on_the_asyncio_executor_only(tmp_path: Path, examples: Path) -> None:
    trial = examples.parent / "trials" / "multi-turn.yaml"
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\ntrial: {trial}\nexecutor: ray\n"
    )
    with pytest.raises(JobError, match="trial runs on the asyncio executor only"):
        plan_rollouts(load_job_file(job_file, {}))
