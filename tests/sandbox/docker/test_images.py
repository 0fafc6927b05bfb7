"""Task images: the image map applied to FROM lines, a FROM that cannot be pulled, the local
catalogue that stands in for common public bases, and the images built for a task's services."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import docker
import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker import images
from reroll.sandbox.docker.catalogue import catalogue_tag
from reroll.sandbox.docker.config import parse_image_map
from reroll.sandbox.docker.conventions import docker_name
from reroll.sandbox.docker.images import (
    BASE_ALIAS,
    map_from_lines,
    service_image,
    task_image,
)
from reroll.tasks.task import load_task
from reroll_contracts.errors import ConfigError, ImageBuildError, ImageUnavailableError

MISSING = "reroll-test/never-built:1"


def test_parse_image_map_takes_items_or_one_comma_separated_string() -> None:
    assert parse_image_map(["ubuntu:24.04=reroll/base:bookworm", " a = b "]) == {
        "ubuntu:24.04": "reroll/base:bookworm",
        "a": "b",
    }
    assert parse_image_map("x=y,,z=w") == {"x": "y", "z": "w"}
    assert parse_image_map("") == {}


@pytest.mark.parametrize("item", ["ubuntu:24.04", "=reroll/base:bookworm", "ubuntu="])
def test_parse_image_map_refuses_an_item_that_is_not_src_eq_dst(item: str) -> None:
    with pytest.raises(ConfigError, match="must be SRC=DST"):
        parse_image_map([item])


def test_map_from_lines_rewrites_images_keeps_flags_stages_and_scratch() -> None:
    dockerfile = (
        "FROM --platform=linux/amd64 ubuntu:24.04 AS build\nRUN make\n"
        "from build\nFROM scratch\nCOPY --from=build /x /x\nFROM python:3.12-slim\n"
    )
    mapped, bases = map_from_lines(dockerfile, {"ubuntu:24.04": "reroll/base:bookworm"})
    assert mapped.splitlines()[0] == "FROM --platform=linux/amd64 reroll/base:bookworm AS build"
    assert "from build\nFROM scratch\n" in mapped and mapped.endswith("FROM python:3.12-slim\n")
    assert bases == ["reroll/base:bookworm", "python:3.12-slim"]


@pytest.mark.slow
@pytest.mark.spawns
def test_a_from_that_cannot_be_pulled_names_the_image_and_the_remedies_and_the_map_fixes_it(
    tmp_path: Path, docker_images: str
) -> None:
    task = load_task(_write_task(tmp_path / "unpullable", f"FROM {MISSING}\nRUN touch /mapped\n"))
    client = docker.from_env()
    try:
        with pytest.raises(ImageUnavailableError) as caught:
            task_image(client, sandbox_spec(task), BASE_ALIAS)
        message = str(caught.value)
        assert MISSING in message and f"--image-map {MISSING}=" in message and "docker tag" in message
        assert not caught.value.retryable and caught.value.error_category == "config"  # a ConfigError
        tag = task_image(client, sandbox_spec(task), BASE_ALIAS, image_map={MISSING: BASE_ALIAS})
        assert client.containers.run(tag, ["ls", "/mapped"], remove=True).strip() == b"/mapped"
        client.images.remove(tag)
    finally:
        client.close()


def test_different_images_build_at_once_and_each_image_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: every build held one lock, so a job's images were built one at a time. Now each
    image has its own lock (and the builds share `REROLL_IMAGE_BUILDS` slots, tests/test_cache.py)."""
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path))
    done: list[str] = []

    def build(tag: str) -> None:
        with images._image_lock(tag):
            done.append(tag)

    with images._image_lock("reroll/task-a:1"):
        other = threading.Thread(target=build, args=("reroll/task-b:1",))
        same = threading.Thread(target=build, args=("reroll/task-a:1",))
        other.start()
        same.start()
        other.join(timeout=10)
        same.join(timeout=0.5)
        assert done == ["reroll/task-b:1"] and same.is_alive()
    same.join(timeout=10)
    assert done == ["reroll/task-b:1", "reroll/task-a:1"]


def _write_task(root: Path, dockerfile: str) -> Path:
    """A task folder whose environment/Dockerfile is `dockerfile`."""
    (root / "environment").mkdir(parents=True)
    (root / "verifier").mkdir()
    (root / "task.md").write_text(f"---\nname: {root.name}\n---\nNothing.\n")
    (root / "verifier" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


@pytest.mark.slow
@pytest.mark.spawns
@pytest.mark.timeout(900)  # the catalogue's trixie-python is debootstrapped on first use
def test_a_public_python_base_that_is_not_local_is_built_from_the_catalogue(
    tmp_path: Path, docker_images: str
) -> None:
    """``FROM python:3.13-slim`` with no registry: trixie with Python 3.13, pip allowed system-wide,
    and the C headers a source build of a package compiles against (``Python.h``, as in the
    official image: gravitational-wave-detection's ``pip install pycbc`` builds ligo-segments)."""
    public = "python:3.13-slim"
    client = docker.from_env()
    try:
        if any(public in image.tags for image in client.images.list(name="python")):
            pytest.skip(f"{public} is a local image here: the catalogue is not needed")
        dockerfile = (
            f"FROM {public}\n"
            "RUN python -c 'import sys; assert sys.version_info[:2] == (3, 13), sys.version'\n"
            "RUN grep -q VERSION_CODENAME=trixie /etc/os-release && pip --version && touch /built\n"
            "RUN test ! -e /usr/lib/python3.13/EXTERNALLY-MANAGED\n"
            "RUN test -f $(python -c 'import sysconfig; print(sysconfig.get_path(\"include\"))')/Python.h\n"
        )
        lines: list[str] = []
        tag = task_image(
            client,
            sandbox_spec(load_task(_write_task(tmp_path / "py313", dockerfile))),
            BASE_ALIAS,
            lines.append,
        )
        assert any(public in line and catalogue_tag("trixie-python") in line for line in lines), lines
        assert client.containers.run(tag, ["ls", "/built"], remove=True).strip() == b"/built"
        assert (
            client.images.get("reroll/debian:trixie-python").id
            == client.images.get(catalogue_tag("trixie-python")).id
        )
        client.images.remove(tag)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.spawns
def test_a_catalogue_image_named_as_a_map_target_is_built_not_pulled(
    tmp_path: Path, variant_images: dict[str, str]
) -> None:
    """Issue 29: ``--image-map SRC=reroll/debian:VARIANT`` on a machine without that alias made
    Docker pull it (there is no such image in any registry); now the catalogue image is built (here
    only its alias is missing: debootstrapping it again would take minutes) and tagged."""
    client = docker.from_env()
    alias = "reroll/debian:trixie"
    try:
        if any(alias in image.tags for image in client.images.list(name="reroll/debian")):
            client.images.remove(alias)  # the tag only: the image keeps its hashed tag
        task = load_task(_write_task(tmp_path / "mapped", f"FROM {MISSING}\nRUN touch /mapped\n"))
        tag = task_image(client, sandbox_spec(task), BASE_ALIAS, image_map={MISSING: alias})
        release = client.containers.run(tag, ["cat", "/etc/os-release", "/mapped"], remove=True)
        assert b"VERSION_CODENAME=trixie" in release
        assert client.images.get(alias).id == client.images.get(variant_images["trixie"]).id
        client.images.remove(tag)
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.spawns
@pytest.mark.parametrize(
    "step",
    ["RUN for i in $(seq 60); do echo tick $i; sleep 1; done", "RUN sleep 60"],
    ids=["talking", "silent"],
)
def test_a_build_longer_than_build_timeout_sec_is_cut(
    tmp_path: Path, docker_images: str, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``environment.build_timeout_sec`` (Harbor's) times the host's
    ``$REROLL_BUILD_TIMEOUT_MULTIPLIER``: checked at each line of the build's output, and a build
    silent for that long is cut too."""
    monkeypatch.setenv("REROLL_BUILD_TIMEOUT_MULTIPLIER", "2")
    root = _write_task(tmp_path / "slow-build", f"FROM {BASE_ALIAS}\n{step}\n")
    (root / "task.md").write_text(
        "---\nname: slow-build\nenvironment:\n  build_timeout_sec: 3\n---\nNothing.\n"
    )
    task = load_task(root)
    assert task.spec.environment.build_timeout_sec == 3 and not task.ignored
    client = docker.from_env()
    started = time.monotonic()
    try:
        with pytest.raises(
            ImageBuildError,
            match=r"longer than its 6 s \(the task's environment.build_timeout_sec; .*TIMEOUT_MULTIPLIER",
        ):
            task_image(client, sandbox_spec(task), BASE_ALIAS)
    finally:
        client.close()
    assert time.monotonic() - started < 60  # cut: the step alone takes 60 s


@pytest.mark.slow
@pytest.mark.spawns
def test_a_built_service_image_is_cached_by_its_content(tmp_path: Path, docker_images: str) -> None:
    """A compose service's ``build``: built once (the tag is the hash of the Dockerfile and the
    context's files), again after a file of the context changed; a failing build names its
    Dockerfile."""
    root = _write_task(tmp_path / "built", f"FROM {BASE_ALIAS}\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "Dockerfile").write_text(f"FROM {BASE_ALIAS}\nCOPY data.txt /srv/data.txt\n")
    (shared / "data.txt").write_text("one\n")
    (root / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main: {build: .}\n  api: {build: ../../shared, command: sleep 60}\n"
    )
    task = sandbox_spec(load_task(root))
    api = task.sibling("api")
    client = docker.from_env()
    built: list[str] = []
    try:
        tag = service_image(client, task, api, BASE_ALIAS, log=built.append)
        assert tag.startswith("reroll/task-built-api:") and built, built
        assert client.containers.run(tag, ["cat", "/srv/data.txt"], remove=True) == b"one\n"
        built.clear()
        assert service_image(client, task, api, BASE_ALIAS, log=built.append) == tag and built == []
        (shared / "data.txt").write_text("two\n")
        changed = service_image(client, task, api, BASE_ALIAS, log=built.append)
        assert (
            changed != tag
            and client.containers.run(changed, ["cat", "/srv/data.txt"], remove=True) == b"two\n"
        )
        client.images.remove(tag)
        client.images.remove(changed)
        (shared / "Dockerfile").write_text(f"FROM {BASE_ALIAS}\nRUN exit 3\n")
        with pytest.raises(
            ImageBuildError, match=re.escape(f"docker build of {shared / 'Dockerfile'} failed")
        ):
            service_image(client, task, api, BASE_ALIAS)
    finally:
        client.close()


def test_docker_names_of_a_run_id_with_spaces_are_valid() -> None:
    """SkillsBench's ``[task] name = "Parallel TF-IDF Similarity Search"`` makes run ids with
    spaces, which Docker refuses in container and volume names (``invalid characters``)."""
    name = docker_name("Parallel TF-IDF Similarity Search__1fea9c78")
    assert name == "Parallel-TF-IDF-Similarity-Search__1fea9c78"
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", f"reroll-{name}")
