"""Fixtures shared by every test folder."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


@functools.cache
def _install_mkfs_tools() -> None:
    """apt-get install btrfs-progs xfsprogs (Debian mirror); failures leave the tools missing."""
    if shutil.which("apt-get") is None:
        return
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "btrfs-progs", "xfsprogs"],
    ):
        subprocess.run(
            argv, capture_output=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        )


@pytest.fixture(params=["btrfs", "xfs"])
def reflink_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder on a fresh loop-mounted btrfs or XFS (reflink=1) file system: one that clones files.

    Installs btrfs-progs and xfsprogs with apt-get when missing (once per session); skips, saying
    why, unless this runs as root with the mkfs tool and a free loop device.
    """
    kind = str(request.param)
    mkfs = {"btrfs": ["mkfs.btrfs", "-q", "-f"], "xfs": ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"]}[kind]
    if os.geteuid() != 0:
        pytest.skip(f"a loop-mounted {kind} needs root")
    if shutil.which(mkfs[0]) is None:
        _install_mkfs_tools()
    if shutil.which(mkfs[0]) is None:
        pytest.skip(f"{mkfs[0]} is not installed ({kind} tools) and apt-get could not install it")
    image = tmp_path / f"{kind}.img"
    with open(image, "wb") as out:
        out.truncate(320 * 1024 * 1024)  # XFS wants at least 300 MB
    # A short path: a local sandbox's Unix socket below it must stay within 107 bytes.
    mount_point = Path(tempfile.mkdtemp(prefix=f"rr-{kind}-"))
    made = subprocess.run([*mkfs, str(image)], capture_output=True, text=True, timeout=60)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mount_point)], capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0 or mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot make and loop-mount a {kind} image here: {made.stderr}{mounted.stderr}".strip())
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, timeout=60)
        mount_point.rmdir()
