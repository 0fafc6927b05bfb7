"""A task's conventions reach its container: the agent's user (named, a bare uid, root, the image's
USER), its working folder (the task's, else the image's WORKDIR) and the sidecar as root."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.tasks.task import load_task
from reroll_contracts.errors import ImageUnavailableError

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]


def task_folder(tmp_path: Path, config: str, dockerfile: str | None = None) -> Path:
    """A legacy task with `config` as its task.toml (and `dockerfile`, if given)."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (tmp_path / "instruction.md").write_text("Do it.\n")
    (tmp_path / "task.toml").write_text(config)
    if dockerfile is not None:
        (tmp_path / "environment").mkdir()
        (tmp_path / "environment" / "Dockerfile").write_text(dockerfile)
    return tmp_path


async def who_and_where(tmp_path: Path, config: str, dockerfile: str | None = None) -> tuple[str, str, str]:
    """``(layout.agent_user, `id -un` of the agent, its working folder)`` in a started sandbox."""
    async with DockerSandbox(
        sandbox_spec(load_task(task_folder(tmp_path, config, dockerfile))), uuid.uuid4().hex[:8]
    ) as box:
        layout = box.layout
        done = await box.exec(
            ["sh", "-c", "id -un; pwd; touch mine"], cwd=layout.workspace, user=layout.agent_user
        )
        assert done.exit_code == 0, done.output_text()
        name, cwd = done.stdout.decode().split()
        sidecar = await box.exec(["id", "-u"])
        assert sidecar.stdout.decode().strip() == "0"
        return layout.agent_user, name, cwd


async def test_a_named_user_and_workdir_are_created_and_owned(tmp_path: Path) -> None:
    config = '[agent]\nuser = "tester"\n[environment]\nworkdir = "/srv/work"\n'
    assert await who_and_where(tmp_path, config) == ("tester", "tester", "/srv/work")


async def test_a_bare_uid_becomes_a_user_with_that_uid(tmp_path: Path) -> None:
    user, name, _ = await who_and_where(tmp_path, "[agent]\nuser = 4321\n")
    assert (user, name) == ("agent", "agent")


async def test_legacy_defaults_are_the_images_user_and_workdir(tmp_path: Path) -> None:
    dockerfile = (
        "FROM reroll/base:bookworm\nRUN useradd -m builder\nUSER builder\nWORKDIR /home/builder/src\n"
    )
    assert await who_and_where(tmp_path, "", dockerfile) == ("builder", "builder", "/home/builder/src")


async def test_legacy_default_without_user_is_root_in_app(tmp_path: Path) -> None:
    assert await who_and_where(tmp_path, "") == ("", "root", "/app")


async def test_a_prebuilt_docker_image_runs_when_there_is_no_dockerfile(tmp_path: Path) -> None:
    config = '[environment]\ndocker_image = "reroll/base:bookworm"\nworkdir = "/work"\n'
    assert await who_and_where(tmp_path, config) == ("", "root", "/work")


async def test_a_docker_image_that_is_not_local_names_the_remedies(tmp_path: Path) -> None:
    config = '[environment]\ndocker_image = "example.invalid/nothing:1"\n'
    with pytest.raises(ImageUnavailableError, match=r"(?s)example\.invalid/nothing:1.*--image-map"):
        await who_and_where(tmp_path, config)
