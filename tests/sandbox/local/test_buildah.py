"""The local sandbox on a task's image built by buildah where no Docker answers
(`reroll.sandbox.local.buildah`): the catalogue stand-in and reroll's base debootstrapped into
buildah's storage, the image unpacked as with Docker, ``--image-map`` and the build limit applied,
and the oracle of a task that RUNs, sets ENV, WORKDIR and USER and COPYs reaching 1.0 on
``--sandbox local``. The first run on a machine debootstraps two images (minutes); later ones
find them in buildah's storage."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local import isolated
from reroll.sandbox.local.buildah import BuildahBuilder, buildah_missing
from reroll.sandbox.local.imagefs import ImageRoot, image_root, rootfs_folder
from reroll.sandbox.local.rootview import ROLLOUT_ID_BASE
from reroll.sandbox.spec import ImageBuild, SandboxSpec
from reroll.tasks.task import load_task
from reroll_contracts.errors import ImageBuildError

from tests.e2e.test_example_tasks import oracle_run

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.slow,
    pytest.mark.skipif(bool(isolated.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(bool(buildah_missing()), reason=buildah_missing() or "buildah is here"),
]

TASK = Path(__file__).parents[2] / "fixtures" / "local-debian-image-task"
"""FROM debian:bookworm-slim (the catalogue's bookworm stands in), a RUN making a tool and a user,
ENV, WORKDIR /srv/work, a COPY of a data file and USER worker."""
NO_DOCKER = "unix:///nonexistent/reroll-test-docker.sock"


@pytest.fixture(scope="module")
def no_docker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Docker unreachable (``DOCKER_HOST`` names no socket) and a cache of this module's own;
    the cache folder."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", NO_DOCKER)
        patch.setenv("REROLL_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="module")
def built(no_docker: Path) -> ImageRoot:
    """The fixture task's image, built by buildah (chosen by ``auto``: no Docker) and unpacked."""
    return image_root(sandbox_spec(load_task(TASK)))


def _task(folder: Path, dockerfile: str, timeout_seconds: float = 600) -> SandboxSpec:
    folder.mkdir()
    (folder / "Dockerfile").write_text(dockerfile)
    build = ImageBuild(context=folder, dockerfile=folder / "Dockerfile")
    return SandboxSpec(
        name=f"buildah-{secrets.token_hex(3)}", build=build, build_timeout_seconds=timeout_seconds
    )


def test_the_image_is_built_by_buildah_and_unpacked_with_its_defaults(
    built: ImageRoot, no_docker: Path
) -> None:
    assert built.root == rootfs_folder(built.image_id) / "root" and built.root.is_relative_to(no_docker)
    assert BuildahBuilder().exists(built.image)
    assert (built.workdir, built.user, built.env["GREETING"]) == ("/srv/work", "worker", "from-the-image")
    assert built.env["PATH"].startswith("/opt/tools/bin:")
    assert (built.root / "srv/work/data.txt").read_text() == "seed-data\n"
    assert (built.root / "opt/tools/bin/mytool").stat().st_mode & 0o777 == 0o755
    assert (built.root / "home/worker").stat().st_uid == ROLLOUT_ID_BASE + 1234
    assert (built.root / "etc/passwd").stat().st_uid == ROLLOUT_ID_BASE


def test_a_second_start_finds_the_image_built(
    built: ImageRoot, no_docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(BuildahBuilder, "build", no_build)
    assert image_root(sandbox_spec(load_task(TASK)), None, "buildah") == built


def test_the_image_map_applies_and_the_build_limit_cuts(built: ImageRoot, tmp_path: Path) -> None:
    """``--image-map`` maps a FROM no registry has onto the catalogue; a build over its
    ``build_timeout_sec`` is cut, naming the limit."""
    mapped = _task(tmp_path / "mapped", "FROM example.invalid/base:1\nRUN touch /mapped\n")
    found = image_root(mapped, {"example.invalid/base:1": "reroll/debian:bookworm"}, "buildah")
    try:
        assert (found.root / "mapped").is_file() and (found.root / "etc/debian_version").is_file()
    finally:
        subprocess.run(["buildah", "rmi", found.image], capture_output=True, check=False)
    slow = _task(tmp_path / "slow", "FROM reroll/debian:bookworm\nRUN sleep 60\n", timeout_seconds=2)
    with pytest.raises(ImageBuildError, match="took longer than its 2 s"):
        image_root(slow, None, "buildah")


def test_the_oracle_reaches_reward_one_on_local_without_docker(
    built: ImageRoot, no_docker: Path, tmp_path: Path
) -> None:
    """Issue 29: where Docker cannot be reached, local refused a task that needs its image; now
    buildah builds it and the task's oracle passes on it."""
    oracle_run(TASK, "local", tmp_path)
