"""The job file's image map (`JobSpec.image_map`), read with the rest of the spec."""

from __future__ import annotations

from pathlib import Path

from reroll.jobs.jobfile import load_job_file


def test_a_job_files_image_map_is_kept_and_the_flag_replaces_it(tmp_path: Path, examples: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        f"tasks: [{examples / 'hello-file'}]\nagents: [oracle]\n"
        "image_map: {ubuntu:24.04: reroll/base:bookworm, 'python:3.12-slim': reroll/base:bookworm}\n"
    )
    spec = load_job_file(job_file, {})
    assert spec.image_map == {
        "ubuntu:24.04": "reroll/base:bookworm",
        "python:3.12-slim": "reroll/base:bookworm",
    }
    assert load_job_file(job_file, {"image_map": {"a": "b"}}).image_map == {"a": "b"}
