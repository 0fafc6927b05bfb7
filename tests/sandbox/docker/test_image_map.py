"""A run recorded with ``--image-map`` on docker: the map is docker's ``image_map`` setting,
recorded in config.json, and ``continue``, ``replay`` and ``branch`` of the run rebuild its image
from it. The task's Dockerfile starts FROM a name that only the map resolves (to reroll's base
image), so a command that lost the map could not build the image at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reroll.sandbox.docker.images import BASE_ALIAS

from tests.conftest import EXAMPLES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]

REROLL = str(Path(sys.executable).parent / "reroll")
ONLY_IN_THE_MAP = "reroll-test.invalid/only-in-the-map:1"
"""A FROM image no registry serves (``.invalid`` never resolves) and no machine has locally."""


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=900)
    print(done.stdout, done.stderr, sep="\n")
    return done


def config(folder: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hello-file FROM `ONLY_IN_THE_MAP`, recorded on docker with mini-swe-agent and the scripted model."""
    workdir = tmp_path_factory.mktemp("image-map")
    task = workdir / "mapped-hello"
    shutil.copytree(EXAMPLES / "hello-file", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace(f"FROM {BASE_ALIAS}", f"FROM {ONLY_IN_THE_MAP}"))
    done = reroll(
        "run", str(task), "--agent", "mini-swe-agent", "--model", "scripted", "--sandbox", "docker",
        "--image-map", f"{ONLY_IN_THE_MAP}={BASE_ALIAS}", "--jobs-dir", "jobs", "--job-name", "record",
        cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = (workdir / "jobs" / "record").iterdir()
    assert config(run)["sandbox"] == "docker"
    assert config(run)["sandbox_config"] == {"image_map": {ONLY_IN_THE_MAP: BASE_ALIAS}}
    assert json.loads((run / "result.json").read_text())["rewards"] == {"reward": 1.0}
    return run


def test_continue_replay_and_branch_rebuild_the_recorded_image(recorded: Path) -> None:
    workdir = recorded.parents[2]
    done = reroll("continue", str(recorded), "--at", "1", "--output", "continued", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (continued,) = (workdir / "continued").iterdir()
    assert config(continued)["sandbox_config"] == config(recorded)["sandbox_config"]
    assert json.loads((continued / "result.json").read_text())["rewards"] == {"reward": 1.0}

    done = reroll("replay", str(recorded), "--output", "replayed", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: faithful" in done.stdout

    done = reroll(
        "branch", str(recorded), "--at", "1", "--model", "scripted", "--output", "branched", cwd=workdir
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (child,) = [folder for folder in (workdir / "branched").glob("*/*") if (folder / "result.json").exists()]
    assert config(child)["sandbox_config"] == config(recorded)["sandbox_config"]
    assert json.loads((child / "result.json").read_text())["rewards"] == {"reward": 1.0}
