"""Task images: the image map applied to FROM lines, and a FROM that cannot be pulled."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from reroll.errors import ConfigError, ImageUnavailableError
from reroll.sandbox.images import BASE_ALIAS, map_from_lines, parse_image_map, task_image
from reroll.tasks import load_task

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
    task_dir = tmp_path / "unpullable"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "verifier").mkdir()
    (task_dir / "task.md").write_text("---\nname: unpullable\n---\nNothing.\n")
    (task_dir / "verifier" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment" / "Dockerfile").write_text(f"FROM {MISSING}\nRUN touch /mapped\n")
    task = load_task(task_dir)
    client = docker.from_env()
    try:
        with pytest.raises(ImageUnavailableError) as caught:
            task_image(client, task, BASE_ALIAS)
        message = str(caught.value)
        assert MISSING in message and f"--image-map {MISSING}=" in message and "docker tag" in message
        assert not caught.value.retryable and caught.value.error_category == "config"  # a ConfigError
        tag = task_image(client, task, BASE_ALIAS, image_map={MISSING: BASE_ALIAS})
        assert client.containers.run(tag, ["ls", "/mapped"], remove=True).strip() == b"/mapped"
        client.images.remove(tag)
    finally:
        client.close()
