"""An agent installs into any task image with a shell, whatever its Python (issue 29, defect 7).

The task image here is what a task's author writes: ``FROM debian:bookworm-slim`` (reroll's
catalogue image stands in for it) with only ``python3`` from apt, no ``python3-venv``, so its
``python3 -m venv`` fails ("ensurepip is not available"). Claude Code (the cheapest of the real
agents installed with pip) is installed with the Python runtime the shared installs carry, and
runs on docker against the bundled scripted model to reward 1.0.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reroll.installs.python_runtime import host_python

from tests.e2e.test_main_job import only_folder, read_json, reroll

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
DOCKERFILE = """FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null \\
 && ! python3 -c 'import ensurepip' && rm -rf /var/lib/apt/lists/*
COPY workspace/ /app/
WORKDIR /app
"""
pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.timeout(1800),  # the catalogue's bookworm is debootstrapped on first use
    pytest.mark.skipif(host_python("3.12") is None, reason="no Python 3.12 on this host to lend"),
]


def test_claude_code_installs_and_runs_in_an_image_without_python3_venv(
    tmp_path: Path, docker_images: str
) -> None:
    task = tmp_path / "hello-file"
    shutil.copytree(EXAMPLES / "hello-file", task)
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
    script = task / "scripted-model.claude-code.yaml"
    done = reroll(
        "run", str(task), "--agent", "claude-code", "--model", f"scripted:{script}", "--sandbox", "docker",
        "--timeout", "300", "--jobs-dir", "jobs", "--job-name", "venvless", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = read_json(only_folder(tmp_path / "jobs" / "venvless") / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}, result
