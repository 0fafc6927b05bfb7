"""The local sandbox on a task's image built by buildah where no Docker answers
(`reroll.sandbox.local.buildah`): the image unpacked as with Docker, ``--image-map`` and the build
limit applied, and the oracle of a task that RUNs, sets ENV, WORKDIR and USER and COPYs reaching
1.0 on ``--sandbox local``. The build's FROM (the catalogue's bookworm) and reroll's base come
into buildah's storage from the local Docker Engine where it answers (`BuildahBuilder.adopt`;
Docker builds them once for every test), else they are debootstrapped into it (minutes, once a
machine); the task's own image is built by buildah with Docker unreachable either way."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.engine import docker_unreachable
from reroll.sandbox.docker.images import base_tag, ensure_catalogue, task_image
from reroll.sandbox.local import rootview
from reroll.sandbox.local.buildah import BuildahBuilder, buildah_missing
from reroll.sandbox.local.imagebuild import image_root
from reroll.sandbox.local.imagefs import ImageRoot, rootfs_folder
from reroll.sandbox.local.rootview import IMAGE_ID_BASE
from reroll.sandbox.spec import ImageBuild, SandboxSpec
from reroll.tasks.task import load_task
from reroll_contracts.errors import ImageBuildError

from tests.e2e.test_example_tasks import oracle_run

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.slow,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(bool(buildah_missing()), reason=buildah_missing() or "buildah is here"),
]

TASK = Path(__file__).parents[2] / "fixtures" / "local-debian-image-task"
"""FROM debian:bookworm-slim (the catalogue's bookworm stands in), a RUN making a tool and a user,
ENV, WORKDIR /srv/work, a COPY of a data file and USER worker."""
NO_DOCKER = "unix:///nonexistent/reroll-test-docker.sock"


@pytest.fixture(scope="module")
def bases_in_buildah(request: pytest.FixtureRequest) -> None:
    """reroll's base and the catalogue's bookworm in buildah's storage: adopted from Docker where
    it answers (built there first if missing), so this module never debootstraps what Docker has."""
    if docker_unreachable():
        return  # built by buildah itself, by debootstrap, on first use
    request.getfixturevalue("docker_images")
    with contextlib.closing(docker.from_env()) as client:
        tags = [base_tag(), ensure_catalogue(client, "bookworm")]
    builder = BuildahBuilder()
    for tag in tags:
        assert builder.exists(tag) or builder.adopt(tag), f"{tag} not adopted from Docker"


@pytest.fixture(scope="module")
def no_docker(bases_in_buildah: None) -> Iterator[None]:
    """Docker unreachable: ``DOCKER_HOST`` names no socket (reroll's cache is this machine's, with
    its sidecar bundle; what this module unpacks there, it removes), and build slots beyond the
    machine's two (``REROLL_IMAGE_BUILDS``), so these small builds never queue behind other jobs'."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", NO_DOCKER)
        patch.setenv("REROLL_IMAGE_BUILDS", "8")
        yield


@pytest.fixture(scope="module")
def built(no_docker: None) -> Iterator[ImageRoot]:
    """The fixture task's image, built by buildah (chosen by ``auto``: no Docker) and unpacked."""
    found = image_root(sandbox_spec(load_task(TASK)))
    yield found
    _remove_copy(found)


def _remove_copy(image: ImageRoot) -> None:
    """Remove `image`'s unpacked copy from reroll's cache (not its image: buildah's storage keeps it,
    as Docker keeps the images its tests build)."""
    shutil.rmtree(image.root.parent)
    image.root.parent.with_name(f"{image.root.parent.name}.lock").unlink(missing_ok=True)


def _task(folder: Path, dockerfile: str, timeout_seconds: float = 600) -> SandboxSpec:
    folder.mkdir()
    (folder / "Dockerfile").write_text(dockerfile)
    build = ImageBuild(context=folder, dockerfile=folder / "Dockerfile")
    return SandboxSpec(
        name=f"buildah-{secrets.token_hex(3)}", build=build, build_timeout_seconds=timeout_seconds
    )


def test_the_image_is_built_by_buildah_and_unpacked_with_its_defaults(built: ImageRoot) -> None:
    assert built.root == rootfs_folder(built.image_id) / "root"
    assert BuildahBuilder().exists(built.image)
    assert (built.workdir, built.user, built.env["GREETING"]) == ("/srv/work", "worker", "from-the-image")
    assert built.env["PATH"].startswith("/opt/tools/bin:")
    assert (built.root / "srv/work/data.txt").read_text() == "seed-data\n"
    assert (built.root / "opt/tools/bin/mytool").stat().st_mode & 0o777 == 0o755
    assert (built.root / "home/worker").stat().st_uid == IMAGE_ID_BASE + 1234
    assert (built.root / "etc/passwd").stat().st_uid == IMAGE_ID_BASE


def test_a_second_start_finds_the_image_built(built: ImageRoot, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(BuildahBuilder, "build", no_build)
    assert image_root(sandbox_spec(load_task(TASK)), None, "buildah") == built


def test_the_image_map_applies_and_the_build_limit_cuts(built: ImageRoot, tmp_path: Path) -> None:
    """``--image-map`` maps a FROM no registry has onto the catalogue; a build over its
    ``build_timeout_sec`` is cut, naming the limit."""
    mapped = _task(tmp_path / "mapped", "FROM example.invalid/base:1\nRUN touch /mapped\n")
    builder = BuildahBuilder()
    tag = task_image(
        builder, mapped, base_tag(), image_map={"example.invalid/base:1": "reroll/debian:bookworm"}
    )
    try:
        with builder.rootfs(tag) as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
            names = {member.name for member in archive}
        assert {"./mapped", "./etc/debian_version"} <= names
    finally:
        subprocess.run(["buildah", "rmi", tag], capture_output=True, check=False)
    slow = _task(tmp_path / "slow", "FROM reroll/debian:bookworm\nRUN sleep 60\n", timeout_seconds=2)
    with pytest.raises(ImageBuildError, match="took longer than its 2 s"):
        image_root(slow, None, "buildah")


def test_the_oracle_reaches_reward_one_on_local_without_docker(built: ImageRoot, tmp_path: Path) -> None:
    """Issue 29: where Docker cannot be reached, local refused a task that needs its image; now
    buildah builds it and the task's oracle passes on it."""
    oracle_run(TASK, "local", tmp_path)


def _tiny_root(folder: Path) -> Path:
    """A tar of a one-file root file system (``./marker``) made in `folder`."""
    (folder / "root").mkdir()
    (folder / "root" / "marker").write_text("a tiny root\n")
    archive = folder / "root.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(folder / "root", arcname=".")
    return archive


def test_a_root_file_system_is_imported_with_its_env_and_labels(tmp_path: Path) -> None:
    """How reroll's debootstrapped images enter buildah's storage (`BuildahBuilder.import_rootfs`)."""
    tag = f"reroll/import-test:{secrets.token_hex(4)}"
    builder = BuildahBuilder()
    try:
        builder.import_rootfs(_tiny_root(tmp_path), tag, {"PATH": "/usr/bin:/bin", "A": "1"}, {"x": "y"})
        assert builder.exists(tag)
        assert builder.defaults(tag).env == {"PATH": "/usr/bin:/bin", "A": "1"}
        with builder.rootfs(tag) as stream, tarfile.open(fileobj=stream, mode="r|") as copied:
            assert "./marker" in {member.name for member in copied}
    finally:
        subprocess.run(["buildah", "rmi", tag], capture_output=True, check=False)


@pytest.mark.skipif(bool(docker_unreachable()), reason="no Docker Engine here")
def test_an_image_docker_has_is_adopted_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image the local Docker Engine has is copied into buildah's storage (``docker-daemon:``),
    never built again; one Docker lacks, or with Docker unreachable, is not adopted."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)  # the module's `no_docker` may be in force
    archive = _tiny_root(tmp_path)
    tag = f"reroll/adopt-test:{secrets.token_hex(4)}"
    subprocess.run(["docker", "import", str(archive), tag], capture_output=True, check=True)
    builder = BuildahBuilder()
    try:
        assert not builder.exists(tag)
        with monkeypatch.context() as patch:
            patch.setenv("DOCKER_HOST", NO_DOCKER)
            assert not builder.adopt(tag)
        assert builder.adopt(tag) and builder.exists(tag)
        with builder.rootfs(tag) as stream, tarfile.open(fileobj=stream, mode="r|") as copied:
            assert "./marker" in {member.name for member in copied}
        assert not builder.adopt(f"{tag}-missing")
    finally:
        subprocess.run(["buildah", "rmi", tag], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)
