"""Fixtures shared by every test folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tasks"


@pytest.fixture
def examples() -> Path:
    """The bundled example tasks."""
    return EXAMPLES


@pytest.fixture(scope="session")
def docker_images() -> str:
    """Build reroll's base and sandbox images with scripts/build-images unless they exist (~90 s
    on a clean machine, under a second when up to date); returns the script's output."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-images")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"scripts/build-images failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module", params=["local", "docker"])
def sandbox_backend(request: pytest.FixtureRequest) -> str:
    """A sandbox backend for a whole module's end-to-end runs: each module runs once per backend;
    docker gets its images built first."""
    if request.param == "docker":
        request.getfixturevalue("docker_images")
    return str(request.param)


def labelled_containers(run_id: str) -> list[str]:
    """Names of the containers, running or not, labelled ``reroll.run_id=<run_id>``."""
    done = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=reroll.run_id={run_id}", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()
