"""The job file's backend settings (`JobSpec.sandbox_config`) and fault plan, read with the spec."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.jobs.jobfile import load_job_file
from reroll.jobs.runner import plan_rollouts
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
