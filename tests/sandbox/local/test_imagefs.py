"""What the local sandbox's host view honours of a Dockerfile, the refusal where neither Docker
nor buildah can build the rest, and the unpacking filter's guards (in process, no Docker)."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
from reroll.sandbox.local import imagebuild, imagefs
from reroll.sandbox.local.imagebuild import image_root
from reroll.sandbox.local.imagefs import (
    FORMAT,
    META_FILE,
    read_meta,
    shifted_filter,
    unhonoured,
)
from reroll.sandbox.local.rootview import IMAGE_ID_BASE
from reroll.sandbox.local.settings import BuilderChoice
from reroll.sandbox.spec import ImageBuild, SandboxSpec
from reroll_contracts.errors import ImageUnavailableError

EXAMPLE = "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n"
"""The bundled examples' Dockerfile: the host view makes exactly this."""


def test_the_examples_dockerfile_is_honoured_by_the_host_view() -> None:
    assert unhonoured(EXAMPLE, None) == []
    assert (
        unhonoured("# a comment\n\nFROM reroll/base:bookworm\nLABEL a=b\nCOPY ./workspace /app\n", None) == []
    )
    assert unhonoured("FROM reroll/base:bookworm\nCOPY workspace/ /srv/\nWORKDIR /srv\n", "/srv") == []


def test_every_other_line_needs_the_image() -> None:
    dockerfile = (
        "FROM python:3.11-slim\n"
        "RUN pip install \\\n    pyyaml\n"
        "ENV PATH=/opt/venv/bin:$PATH\n"
        "COPY data.csv /root/\n"
        "COPY workspace/ /elsewhere/\n"
        "WORKDIR /root\n"
        "USER 1000\n"
    )
    assert unhonoured(dockerfile, None) == [
        "FROM python:3.11-slim",
        "RUN pip install      pyyaml",
        "ENV PATH=/opt/venv/bin:$PATH",
        "COPY data.csv /root/",
        "COPY workspace/ /elsewhere/",
        "WORKDIR /root",
        "USER 1000",
    ]
    assert unhonoured("FROM reroll/base:bookworm AS build\n", None) == ["FROM reroll/base:bookworm AS build"]


def test_without_docker_or_buildah_a_task_that_needs_its_image_is_refused_with_its_lines_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: local ignored the Dockerfile silently; where neither Docker nor buildah can build
    it, the refusal names the lines the host view cannot honour, why, ``--sandbox docker`` and the
    install command."""
    (tmp_path / "Dockerfile").write_text("FROM reroll/base:bookworm\nRUN apt-get install -y jq\n")
    spec = SandboxSpec(name="t", build=ImageBuild(context=tmp_path, dockerfile=tmp_path / "Dockerfile"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setenv("PATH", str(tmp_path))  # no buildah on it
    with pytest.raises(ImageUnavailableError) as raised:
        image_root(spec)
    message = str(raised.value)
    assert "RUN apt-get install -y jq" in message and "FROM reroll/base" not in message.split("honours")[0]
    assert "--sandbox docker" in message and "Docker is not reachable" in message
    assert "buildah is not installed" in message and "apt-get install buildah" in message
    assert imagefs.spec_unhonoured(SandboxSpec(name="t")) == []
    assert imagefs.spec_unhonoured(SandboxSpec(name="t", docker_image="python:3.12")) == [
        "environment.docker_image = python:3.12"
    ]


@pytest.mark.parametrize(
    ("choice", "reason"),
    [("docker", "Docker is not reachable"), ("buildah", "Docker is not used (image_builder buildah)")],
)
def test_a_builder_forced_but_missing_is_refused_without_falling_back(
    choice: BuilderChoice, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``image_builder`` docker never falls back to buildah (nor buildah to Docker)."""
    (tmp_path / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN true\n")
    spec = SandboxSpec(name="t", build=ImageBuild(context=tmp_path, dockerfile=tmp_path / "Dockerfile"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    monkeypatch.setattr(imagebuild, "buildah_missing", lambda: "buildah is not installed (here)")
    with pytest.raises(ImageUnavailableError, match=re.escape(reason)):
        image_root(spec, None, choice)
    assert imagebuild.no_builder(choice).startswith(reason)
    monkeypatch.setattr(imagebuild, "buildah_missing", lambda: "")
    assert bool(imagebuild.no_builder(choice)) == (choice == "docker")


def _archive(members: list[tuple[tarfile.TarInfo, bytes]]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    "members",
    [
        [(_member("../escaped"), b"x")],
        [(_member("/etc/escaped"), b"x")],
        [(_member("link", tarfile.LNKTYPE, linkname="../../etc/passwd"), b"")],
        [(_member("up", tarfile.SYMTYPE, linkname=".."), b""), (_member("up/escaped"), b"x")],
        [(_member("f", tarfile.SYMTYPE, linkname="../../escaped"), b""), (_member("f"), b"x")],
    ],
    ids=["dot-dot", "absolute", "hard-link-out", "below-a-symlink", "over-a-symlink"],
)
def test_unpacking_refuses_what_would_land_outside(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]]
) -> None:
    """An image's archive is the task's: nothing of it may be written outside the cache folder."""
    dest = tmp_path / "a" / "root"
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=_archive(members), mode="r|") as archive, pytest.raises(tarfile.FilterError):
        archive.extractall(dest, numeric_owner=True, filter=shifted_filter(IMAGE_ID_BASE))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "a" / "escaped").exists()


def test_unpacking_shifts_owners_keeps_modes_and_leaves_out_devices(tmp_path: Path) -> None:
    members = [
        (_member("tmp", tarfile.DIRTYPE, mode=0o1777), b""),
        (_member("home/agent/file", uid=1000, gid=1000, mode=0o640), b"mine"),
        (_member("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3), b""),
    ]
    with tarfile.open(fileobj=_archive(members), mode="r|") as archive:
        archive.extractall(tmp_path, numeric_owner=True, filter=shifted_filter(IMAGE_ID_BASE))
    mine = (tmp_path / "home/agent/file").stat()
    assert (mine.st_uid, mine.st_gid, mine.st_mode & 0o7777) == (IMAGE_ID_BASE + 1000,) * 2 + (0o640,)
    assert (tmp_path / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert (tmp_path / "tmp").stat().st_uid == IMAGE_ID_BASE
    assert not (tmp_path / "dev/null").exists()


def test_a_half_unpacked_or_foreign_folder_is_not_a_cached_image(tmp_path: Path) -> None:
    """Only a folder whose ``image.json`` (written last) names this image and format is used."""
    folder = tmp_path / "abc"
    (folder / "root").mkdir(parents=True)
    assert read_meta(folder, "sha256:abc") is None  # unpacked, never finished
    meta: dict[str, Any] = {
        "root": str(folder / "root"),
        "image": "t:1",
        "image_id": "sha256:abc",
        "workdir": "/app",
    }
    meta |= {"user": "root", "env": {"PATH": "/bin"}, "format": FORMAT}
    (folder / META_FILE).write_text(json.dumps(meta))
    found = read_meta(folder, "sha256:abc")
    assert found is not None and found.env == {"PATH": "/bin"} and found.root == folder / "root"
    assert read_meta(folder, "sha256:other") is None
    (folder / META_FILE).write_text(json.dumps(meta | {"format": FORMAT + 1}))
    assert read_meta(folder, "sha256:abc") is None
    (folder / META_FILE).write_text(json.dumps(meta)[:-5])  # cut short
    assert read_meta(folder, "sha256:abc") is None
