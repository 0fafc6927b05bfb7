"""The bundled task `hello-file`, and the images the docker sandbox's contract runs on besides
reroll's base image: one without Python, one with nothing but a static busybox."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker
import docker.errors
import pytest
from reroll.tasks import Task, load_task

from tests.conftest import EXAMPLES, spawning

TEST_IMAGE_LABEL = "reroll.test-image"
"""Label of the images these fixtures build (``docker image prune --filter label=…`` removes them)."""

_NO_PYTHON_DOCKERFILE = """FROM reroll/base:bookworm
RUN apt-get purge -y -qq --auto-remove python3 python3-minimal python3.11 python3.11-minimal \\
      libpython3.11-minimal libpython3.11-stdlib >/dev/null \\
 && ! command -v python3
"""
_BUSYBOX_DOCKERFILE = """FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
"""


@pytest.fixture
def task() -> Task:
    return load_task(EXAMPLES / "hello-file")


def _build(client: docker.DockerClient, repository: str, dockerfile: str, files: dict[str, bytes]) -> str:
    """Build `dockerfile` with `files` as its context, as ``repository:<hash of both>`` unless it exists."""
    digest = hashlib.sha256(dockerfile.encode())
    for name, content in sorted(files.items()):
        digest.update(name.encode() + hashlib.sha256(content).digest())
    tag = f"{repository}:{digest.hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        for name, content in {"Dockerfile": dockerfile.encode(), **files}.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(content), 0o755
            archive.addfile(member, io.BytesIO(content))
    context.seek(0)
    client.images.build(
        fileobj=context,
        custom_context=True,
        tag=tag,
        rm=True,
        network_mode="none",
        labels={TEST_IMAGE_LABEL: "1"},
    )
    return tag


def _static_busybox() -> bytes:
    """Debian's static busybox binary (package busybox-static, from the Debian mirror with apt-get)."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(
            ["apt-get", "download", "-qq", "busybox-static"],
            cwd=scratch,
            check=True,
            capture_output=True,
            timeout=300,
        )
        (package,) = Path(scratch).glob("busybox-static_*.deb")
        subprocess.run(["dpkg-deb", "-x", str(package), f"{scratch}/root"], check=True, timeout=60)
        return Path(scratch, "root", "bin", "busybox").read_bytes()


@pytest.fixture(scope="session")
@spawning
def variant_images(docker_images: str) -> dict[str, str]:
    """``{"no-python": tag, "busybox": tag}``: images built once (cached by tag) from reroll's base
    image minus Python, and from scratch with Debian's static busybox alone."""
    client = docker.from_env()
    try:
        return {
            "no-python": _build(client, "reroll-test/no-python", _NO_PYTHON_DOCKERFILE, {}),
            "busybox": _build(
                client, "reroll-test/busybox", _BUSYBOX_DOCKERFILE, {"busybox": _static_busybox()}
            ),
        }
    finally:
        client.close()
