"""The ``python:3.12`` stand-in (`reroll.sandbox.docker.python_standin`): Debian bookworm with the
host's CPython 3.12 at ``/usr/local``, built for a task ``FROM python:3.12-slim`` with no flag,
then used as the official image is: ``python3``, ``pip install`` of a local wheel system-wide, the
C headers, and nothing of the host's pyenv prefix left in its build configuration."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import docker
import pytest
from reroll.installs.python_runtime import host_python
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.catalogue import catalogue_tag
from reroll.sandbox.docker.images import BASE_ALIAS, task_image
from reroll.tasks.task import load_task

PUBLIC = "python:3.12-slim"


def _wheel(folder: Path) -> Path:
    """A pure-Python wheel ``hello-1.0`` (module ``hello``, ``hello.GREETING == "hi"``) in `folder`."""
    files = {
        "hello.py": b'GREETING = "hi"\n',
        "hello-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n",
        "hello-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(content)}\n"
    path = folder / "hello-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr("hello-1.0.dist-info/RECORD", record + "hello-1.0.dist-info/RECORD,,\n")
    return path


@pytest.mark.slow
@pytest.mark.spawns
@pytest.mark.timeout(900)  # the stand-in is debootstrapped on first use
@pytest.mark.skipif(host_python("3.12") is None, reason="no CPython 3.12 on this host to stand in")
def test_python_3_12_slim_builds_on_the_host_cpython_stand_in_with_pip_and_headers(
    tmp_path: Path, docker_images: str
) -> None:
    """Issue 29: ``FROM python:3.12-slim`` needed ``--image-map`` (no Debian ships 3.12)."""
    client = docker.from_env()
    try:
        if any(PUBLIC in image.tags for image in client.images.list(name="python")):
            pytest.skip(f"{PUBLIC} is a local image here: the catalogue is not needed")
        task = tmp_path / "py312"
        (task / "environment").mkdir(parents=True)
        (task / "verifier").mkdir()
        (task / "task.md").write_text("---\nname: py312\n---\nNothing.\n")
        (task / "verifier" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
        _wheel(task / "environment")
        (task / "environment" / "Dockerfile").write_text(
            f"FROM {PUBLIC}\n"
            "COPY hello-1.0-py3-none-any.whl /tmp/\n"
            "RUN pip install --no-index /tmp/hello-1.0-py3-none-any.whl\n"
        )
        lines: list[str] = []
        tag = task_image(client, sandbox_spec(load_task(task)), BASE_ALIAS, lines.append)
        assert any(PUBLIC in line and catalogue_tag("bookworm-python3.12") in line for line in lines), lines
        script = (
            "python3 --version && python --version && python3.12 --version && pip3 --version && "
            "python -c 'import hello, ssl, sqlite3; print(hello.GREETING, hello.__file__)' && "
            "ls $(python3.12-config --includes | cut -d' ' -f1 | cut -c3-)/Python.h && "
            "python -c 'import sysconfig; print(sysconfig.get_config_vars())' && "
            "grep VERSION_CODENAME /etc/os-release"
        )
        output = client.containers.run(tag, ["sh", "-c", script], remove=True).decode()
        assert output.startswith("Python 3.12.") and "pip " in output, output
        assert "hi /usr/local/lib/python3.12/site-packages/hello.py" in output, output
        assert "/usr/local/include/python3.12/Python.h" in output and "VERSION_CODENAME=bookworm" in output
        assert ".pyenv" not in output  # the host's prefix is rewritten
        client.images.remove(tag)
    finally:
        client.close()
