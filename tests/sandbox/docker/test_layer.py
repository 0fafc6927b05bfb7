"""The container's own layer on the sized file system (`reroll.sandbox.docker.layer`): which host
folder is taken, and nothing else. The attack (a root agent filling ``/opt``) is
``tests/security/test_resource_limits.py``."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from docker.models.containers import Container
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker import layer
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.prune import prune
from reroll.tasks.task import load_task

from tests.conftest import EXAMPLES


def container(upper: str | None, driver: str = "fuse-overlayfs") -> Container:
    data = {} if upper is None else {"UpperDir": upper, "WorkDir": "x"}
    return cast(Container, type("Fake", (), {"attrs": {"GraphDriver": {"Name": driver, "Data": data}}})())


def test_the_layer_folder_is_the_parent_of_the_upper_folder(tmp_path: Path) -> None:
    (tmp_path / "diff").mkdir()
    assert layer.layer_folder(container(str(tmp_path / "diff"))) == tmp_path


@pytest.mark.parametrize("upper", [None, "", "relative/diff", "/nonexistent-reroll/diff", "UPPER/notdiff"])
def test_no_usable_upper_folder_is_none(upper: str | None, tmp_path: Path) -> None:
    if upper is not None:
        upper = upper.replace("UPPER", str(tmp_path))
    assert layer.layer_folder(container(upper)) is None


def test_a_linked_layer_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real" / "diff").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert layer.layer_folder(container(str(tmp_path / "link" / "diff"))) is None


def test_a_driver_without_upper_folder_leaves_the_layer_uncounted_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **_: ran.append(args))
    assert layer.mount_layer(container(None, driver="vfs"), tmp_path) is None
    assert not ran and "vfs" in caplog.text and "not counted" in caplog.text


@pytest.mark.slow
@pytest.mark.spawns
@pytest.mark.usefixtures("docker_images")
async def test_prune_removes_a_killed_controllers_mounted_layer() -> None:
    """A controller killed before `stop` leaves the bind mount over the layer's folder: prune's
    ``docker rm -f`` still removes the container, the mount and the sized disk."""
    run_id = f"layer-prune-{uuid.uuid4().hex[:8]}"
    spec = sandbox_spec(load_task(EXAMPLES / "hello-file"))
    sandbox = DockerSandbox(spec, run_id, DockerSandboxConfig(image="reroll/base:bookworm"))
    await sandbox.start()
    try:
        assert sandbox._layer is not None and sandbox._disk is not None
        folder, image = sandbox._layer, sandbox._disk.folder
        assert (await sandbox.exec(["sh", "-c", "echo x > /opt/planted"])).exit_code == 0
        removed = prune(run_id)
        assert len(removed["containers"]) == 1, removed
        assert not folder.exists() and str(folder) not in Path("/proc/mounts").read_text()
        assert not image.exists(), "the sized disk went with its volumes"
    finally:
        await sandbox.stop()
