"""The local sandbox on a task's own image, with real Docker: the image is unpacked once (owners
shifted, a half or failed unpacking never used), and a task whose Dockerfile installs with pip and
sets ENV, WORKDIR and USER reaches its oracle's 1.0 on ``--sandbox local`` (it scored 0 on the host view).
Run under ``flock /tmp/reroll-docker.lock``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.engine import docker_unreachable
from reroll.sandbox.docker.images import ensure_images, task_image
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.local import imagebuild, imagefs, rootview
from reroll.sandbox.local.imagebuild import unpacked
from reroll.sandbox.local.imagefs import META_FILE, rootfs_folder
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.rootview import IMAGE_ID_BASE
from reroll.tasks.task import load_task
from reroll_contracts.errors import SandboxError

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(bool(docker_unreachable()), reason="no Docker Engine here"),
]

REROLL = str(Path(sys.executable).parent / "reroll")
TASK = Path(__file__).parents[2] / "fixtures" / "local-image-task"
"""Its Dockerfile pip-installs PyYAML, puts a tool on PATH by ENV, sets WORKDIR /srv/work, COPYs
a data file and sets USER worker: none of which the host view makes."""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """reroll's cache folder of the test (unpacked images land in it)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("REROLL_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(scope="module")
def small_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A tiny image built here (``FROM scratch``: one root file, one of uid 1000, WORKDIR, ENV);
    ``(tag, id)``, removed at the end."""
    context = tmp_path_factory.mktemp("small-image")
    (context / "file").write_text("content\n")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY file /etc/marker\nCOPY --chown=1000:1000 file /home/agent/file\n"
        "WORKDIR /srv\nENV PATH=/opt/bin:/usr/bin GREETING=hi\n"
    )
    tag = f"reroll-test/imagefs:{secrets.token_hex(4)}"
    with contextlib.closing(docker.from_env()) as client:
        image, _ = client.images.build(path=str(context), tag=tag, labels={"reroll.managed": "1"}, rm=True)
        try:
            yield tag, str(image.id)
        finally:
            client.images.remove(tag, force=True)


def _unpacked(tag: str, image_id: str) -> imagefs.ImageRoot:
    with contextlib.closing(docker.from_env()) as client:
        return unpacked(client, tag, image_id)


def test_an_image_is_unpacked_once_with_its_owners_shifted(
    small_image: tuple[str, str], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, image_id = small_image
    found = _unpacked(tag, image_id)
    assert found.root == rootfs_folder(image_id) / "root" and found.root.is_relative_to(cache)
    assert (found.workdir, found.user, found.env) == (
        "/srv",
        "root",
        {"PATH": "/opt/bin:/usr/bin", "GREETING": "hi"},
    )
    assert (found.root / "home/agent/file").stat().st_uid == IMAGE_ID_BASE + 1000
    assert (found.root / "etc/marker").stat().st_uid == IMAGE_ID_BASE
    assert found.root.stat().st_uid == IMAGE_ID_BASE

    def no_second_export(*args: object) -> None:
        raise AssertionError("unpacked again")

    monkeypatch.setattr(imagebuild, "_export", no_second_export)
    assert _unpacked(tag, image_id) == found


def test_a_half_unpacked_cache_is_never_used(small_image: tuple[str, str], cache: Path) -> None:
    """A crash mid-way leaves a folder without ``image.json`` (or a ``.partial-*`` one): it is
    unpacked again, whole."""
    tag, image_id = small_image
    folder = rootfs_folder(image_id)
    (folder / "root" / "etc").mkdir(parents=True)
    (folder / "root" / "etc" / "planted").write_text("half\n")
    stray = folder.with_name(f".partial-{folder.name}-dead")
    (stray / "root").mkdir(parents=True)
    found = _unpacked(tag, image_id)
    assert (found.root / "etc/marker").read_text() == "content\n"
    assert not (found.root / "etc/planted").exists() and (folder / META_FILE).is_file()


def test_a_failed_unpacking_leaves_nothing_behind(
    small_image: tuple[str, str], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag, image_id = small_image

    def fail_midway(client: object, tag: str, root: Path) -> None:
        root.mkdir()
        (root / "half").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(imagebuild, "_export", fail_midway)
    with pytest.raises(SandboxError, match="disk full"):
        _unpacked(tag, image_id)
    assert [p.name for p in (cache / "rootfs").iterdir() if not p.name.endswith(".lock")] == []


def test_prune_removes_the_copies_of_gone_images_but_not_one_a_sandbox_holds(
    cache: Path, tmp_path: Path
) -> None:
    """An unpacked copy lives as long as its image: once Docker has it no more, prune removes it
    (and a half copy), unless a sandbox runs on it (`imagefs.hold`)."""
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY Dockerfile /etc/marker\n")
    tag = f"reroll-test/imagefs-prune:{secrets.token_hex(4)}"
    with contextlib.closing(docker.from_env()) as client:
        image, _ = client.images.build(path=str(tmp_path), tag=tag, labels={"reroll.managed": "1"}, rm=True)
        found = unpacked(client, tag, str(image.id))
        stray = rootfs_folder(str(image.id)).with_name(f".partial-{rootfs_folder(str(image.id)).name}-dead")
        stray.mkdir()
        assert imagebuild.prune_unpacked() == [str(stray)]  # its image is still there
        client.images.remove(tag, force=True)
    held = imagefs.hold(found)
    assert imagebuild.prune_unpacked() == [] and found.root.is_dir()  # a sandbox runs on it
    held.close()
    assert imagebuild.prune_unpacked() == [str(found.root.parent)] and not found.root.parent.exists()


def test_the_sandbox_runs_on_the_image_and_sees_nothing_of_the_host(tmp_path: Path) -> None:
    """The image's files, ENV, WORKDIR and USER; the host's /tmp and /root are not there; writes land on
    the sandbox's own disk, never in the cached image."""
    host_marker = Path("/root") / f"reroll-imagefs-{secrets.token_hex(4)}"
    host_marker.write_text("host\n")
    (tmp_path / "marker").write_text("host\n")
    script = (
        f"pwd; command -v mytool; cat data.txt; test ! -e {host_marker} && test ! -e {tmp_path}/marker"
        " && echo host-hidden; echo planted > /usr/bin/planted && echo wrote-usr"
    )
    try:
        output, sandbox_layout = asyncio.run(_run_in_sandbox(script))
    finally:
        host_marker.unlink()
    assert output.split() == ["/srv/work", "/opt/tools/bin/mytool", "seed-data", "host-hidden", "wrote-usr"]
    assert sandbox_layout.workspace == "/srv/work" and sandbox_layout.agent_user == "worker"
    assert sandbox_layout.image_env["PATH"].startswith("/opt/tools/bin:")
    spec = sandbox_spec(load_task(TASK))
    with contextlib.closing(docker.from_env()) as client:
        image_id = str(client.images.get(task_image(client, spec, ensure_images(client).base)).id)
    assert not (rootfs_folder(image_id) / "root/usr/bin/planted").exists()


async def _run_in_sandbox(script: str) -> tuple[str, SandboxLayout]:
    async with IsolatedSandbox(sandbox_spec(load_task(TASK)), f"imagefs-{secrets.token_hex(3)}") as sandbox:
        env = {"PATH": sandbox.layout.image_env["PATH"]}
        done = await sandbox.exec(
            ["sh", "-c", script], cwd=sandbox.layout.workspace, env=env, timeout_seconds=60
        )
        return done.stdout.decode(), sandbox.layout


def test_a_task_that_installs_and_sets_env_and_workdir_reaches_its_oracle_reward_on_local(
    tmp_path: Path,
) -> None:
    """Issue 29: the default sandbox ignored the Dockerfile (the oracle scored 0: no mytool, no
    PyYAML, no data.txt, test.sh not in the image's WORKDIR); now it runs on the image."""
    done = subprocess.run(
        [REROLL, "run", str(TASK), "--agent", "oracle", "--sandbox", "local", "--jobs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rewards: {'reward': 1.0}" in done.stdout, done.stdout + done.stderr


def test_two_sandboxes_on_one_image_each_see_it_owned_by_their_own_range() -> None:
    """Issue 32: the unpacked image (owned by `IMAGE_ID_BASE..`) is shared, not its owner: each
    sandbox sees it through an idmapped mount as its own root's and user's, and what root changes
    in ``/etc`` (a copy-up into its own layer) stays owned by its own range."""
    asyncio.run(_two_on_one_image())


async def _two_on_one_image() -> None:
    spec = sandbox_spec(load_task(TASK))
    async with IsolatedSandbox(spec, "image-ids-a") as first, IsolatedSandbox(spec, "image-ids-b") as second:
        assert first.id_base != second.id_base
        for sandbox in (first, second):
            done = await sandbox.exec(
                ["sh", "-c", "stat -c %u /etc/passwd data.txt; echo changed >> /etc/passwd"],
                cwd=sandbox.layout.workspace,
            )
            assert done.exit_code == 0, done.output_text()
            inside = done.stdout.decode().split()
            assert inside[0] == "0" and inside[1] != "65534", inside  # root's, the image user's: mapped
            root = Path(f"/proc/{sandbox.init_pid}/root")
            assert (root / "etc/passwd").stat().st_uid == sandbox.id_base  # copied up, still its own
            assert (root / "usr/bin").stat().st_uid == sandbox.id_base  # the shared lower, its own
        image = first._image
        assert image is not None and (image.root / "etc/passwd").stat().st_uid == IMAGE_ID_BASE
        assert "changed" not in (image.root / "etc/passwd").read_text()
