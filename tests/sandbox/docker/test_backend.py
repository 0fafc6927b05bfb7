"""What only the docker backend does: network policies, limits, labels, the private sidecar socket, prune."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.models.containers
import pytest
from reroll.host.owner import owner_label
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.ahead import discard_ahead
from reroll.sandbox.docker import backend as docker_backend
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.conventions import AGENTS_DIR, docker_name
from reroll.sandbox.docker.engine import SHARED_VOLUMES
from reroll.sandbox.docker.installs import install_store
from reroll.sandbox.docker.prune import prune
from reroll.sandbox.layout import SANDBOX_HOSTNAME
from reroll.tasks.task import Task, load_task
from reroll_contracts.errors import SandboxError

from tests.conftest import labelled_containers

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]
EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"

CONNECT_SCRIPT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError as exc:
    print(type(exc).__name__, exc)
    sys.exit(1)
print("connected")
"""

FORK_BOMB = """
import os, signal, time
children = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            os.close(1), os.close(2), time.sleep(30), os._exit(0)
        children.append(pid)
    print("forked", len(children))
except OSError as exc:
    print("EAGAIN" if exc.errno == 11 else exc, len(children))
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""


def with_network(task: Task, policy: str) -> Task:
    limits = {"network": policy, "cpus": 0.5, "memory_mb": 256, "pids_max": 64}
    environment = task.spec.environment.model_copy(update=limits)
    return task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})


@pytest.fixture
async def isolated(task: Task) -> AsyncIterator[DockerSandbox]:
    sandbox = DockerSandbox(sandbox_spec(with_network(task, "none")), f"docker-{uuid.uuid4().hex[:8]}")
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.stop()


def networks(sandbox: DockerSandbox) -> list[str]:
    assert sandbox.container is not None
    sandbox.container.reload()
    return sorted(sandbox.container.attrs["NetworkSettings"]["Networks"])


async def connect(sandbox: DockerSandbox, host: str, port: int) -> str:
    result = await sandbox.exec(["python3", "-c", CONNECT_SCRIPT, host, str(port)], timeout_seconds=20)
    return result.output_text().strip()


async def test_network_none_reaches_only_the_ports_it_opens(isolated: DockerSandbox) -> None:
    """The rollout's own network; its gateway's other ports are refused (more in tests/security/)."""
    host = await isolated.host_address()
    with socket.create_server((host, 0)) as server, socket.create_server((host, 0)) as closed:
        await isolated.allow_host_port(server.getsockname()[1])
        assert await connect(isolated, host, server.getsockname()[1]) == "connected"
        assert await connect(isolated, host, closed.getsockname()[1]) != "connected"
    # A public address: refused at once inside the container (no route), nothing leaves the machine.
    assert await connect(isolated, "192.0.2.1", 80) != "connected"
    own = f"reroll-none-{isolated._firewall_key}"
    assert networks(isolated) == [own]
    async with isolated.egress() as env:
        assert "SSL_CERT_FILE" in env
        assert networks(isolated) == ["reroll-full", own], "egress (agent installs) joins reroll-full"
    assert networks(isolated) == [own], "and leaves it afterwards"


async def test_container_has_limits_labels_and_a_private_sidecar_socket(isolated: DockerSandbox) -> None:
    assert isolated.container is not None
    isolated.container.reload()
    host_config = isolated.container.attrs["HostConfig"]
    assert host_config["NanoCpus"] == 500_000_000 and host_config["Memory"] == 256 * 1024 * 1024
    assert (host_config["MemorySwap"], host_config["PidsLimit"]) == (256 * 1024 * 1024, 64)
    assert isolated.container.labels["reroll.run_id"] == isolated.run_id
    result = await isolated.exec(
        ["sh", "-c", "cat /run/reroll/token || ls /run/reroll"], user=isolated.layout.agent_user
    )
    assert result.exit_code != 0 and b"Permission denied" in result.stderr
    hostname = await isolated.exec(["hostname"])
    assert hostname.stdout.strip() == SANDBOX_HOSTNAME.encode()  # the same in every sandbox
    # A fork bomb (red team, issue 12 item 4: before, pids.max was "max") gets EAGAIN at the limit.
    result = await isolated.exec(
        ["python3", "-c", FORK_BOMB], user=isolated.layout.agent_user, timeout_seconds=60
    )
    assert result.stdout.split()[0] == b"EAGAIN" and int(result.stdout.split()[1]) < 64, result


def mounts(sandbox: DockerSandbox) -> dict[str, dict[str, Any]]:
    assert sandbox.container is not None
    sandbox.container.reload()
    return {mount["Destination"]: mount for mount in sandbox.container.attrs["Mounts"]}


async def test_installs_are_read_only_but_in_an_install_container_of_their_own(
    isolated: DockerSandbox,
) -> None:
    """Shared installs (issue 19 item 4; the attacks are in tests/security/test_shared_installs.py)."""
    assert mounts(isolated)[AGENTS_DIR]["RW"] is False
    probe = f"{AGENTS_DIR}/.probe-{isolated.run_id}"
    assert (await isolated.exec(["touch", probe])).exit_code != 0, "root wrote the agents volume"
    async with isolated.installer() as installer:
        assert installer.container is not None and installer.container.name is not None
        labels = installer.container.labels
        assert (labels["reroll.role"], labels["reroll.run_id"]) == ("install", isolated.run_id)
        assert installer.container.name in labelled_containers(isolated.run_id)
        assert mounts(installer)[AGENTS_DIR]["RW"] is True and networks(installer) == ["reroll-full"]
        assert (await installer.exec(["sh", "-c", f"touch {probe} && rm {probe}"])).exit_code == 0
    assert labelled_containers(isolated.run_id) == [isolated.container and isolated.container.name]


async def test_stop_removes_the_container(task: Task) -> None:
    run_id = f"stopped-{uuid.uuid4().hex[:8]}"
    async with DockerSandbox(sandbox_spec(task), run_id) as sandbox:
        assert len(labelled_containers(run_id)) == 1
    await sandbox.stop()  # twice is fine
    assert labelled_containers(run_id) == []


async def test_a_container_that_fails_to_start_is_removed(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine refusing to start a created container (seen: an ambiguous network name) fails
    the start with a SandboxError naming the image, and leaves no container or volume holding
    the sandbox's disk (before, the container stayed "Created" and its volumes in use)."""

    def refuse(self: docker.models.containers.Container, **kwargs: object) -> None:
        raise docker.errors.APIError("the engine refused to start it")

    monkeypatch.setattr(docker.models.containers.Container, "start", refuse)
    run_id = f"unstarted-{uuid.uuid4().hex[:8]}"
    sandbox = DockerSandbox(sandbox_spec(task), run_id)
    with pytest.raises(SandboxError, match=r"cannot start a container of .*refused to start"):
        await sandbox.start()
    assert labelled_containers(run_id) == []
    with contextlib.closing(docker.from_env()) as engine:
        assert engine.volumes.list(filters={"name": docker_name(run_id)}) == []


async def test_prune_removes_a_leftover_container(task: Task) -> None:
    run_id = f"leftover-{uuid.uuid4().hex[:8]}"
    sandbox = DockerSandbox(sandbox_spec(task), run_id)
    await sandbox.start()
    container = sandbox.container
    assert container is not None
    await sandbox.disconnect()  # a controller that died: nothing stopped the container
    nothing: dict[str, list[str]] = {
        "containers": [],
        "kept": [],
        "volumes": [],
        "networks": [],
        "firewall_tables": [],
    }
    assert await asyncio.to_thread(prune, "no-such-run") == nothing
    reroll = str(Path(sys.executable).parent / "reroll")
    done = await asyncio.to_thread(
        subprocess.run,
        [reroll, "sandbox", "prune", "--run-id", run_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and f"removed 1 containers: {container.name}" in done.stdout
    with pytest.raises(docker.errors.NotFound):
        container.reload()
    await sandbox.stop()


async def test_prune_keeps_running_rollouts_and_removes_orphans(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --run-id, prune removes only containers whose reroll process is gone, unless --all."""
    live = DockerSandbox(sandbox_spec(task), f"live-{uuid.uuid4().hex[:8]}")
    await live.start()
    dead_owner = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    monkeypatch.setattr(docker_backend, "owner_label", lambda: owner_label(int(dead_owner.stdout)))
    orphan = DockerSandbox(sandbox_spec(task), f"orphan-{uuid.uuid4().hex[:8]}")
    await orphan.start()
    assert live.container is not None and orphan.container is not None
    await orphan.disconnect()  # its controller "died": nothing stops the container
    reroll = str(Path(sys.executable).parent / "reroll")
    with contextlib.closing(
        docker.from_env()
    ) as engine:  # the shared volumes exist; the manifests' is unused
        install_store(engine)
    try:
        done = await asyncio.to_thread(
            subprocess.run, [reroll, "sandbox", "prune"], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert orphan.container.name in done.stdout and live.container.name not in done.stdout
        assert "containers of running rollouts (--all removes them too)" in done.stdout
        assert not SHARED_VOLUMES & set(done.stdout.replace(",", " ").split()), "shared installs pruned"
        with pytest.raises(docker.errors.NotFound):
            orphan.container.reload()
        assert (await live.exec(["true"])).exit_code == 0  # its socket folder is kept too
        by_run_id = await asyncio.to_thread(prune, live.run_id)
        assert by_run_id["containers"] == [live.container.name]
        with pytest.raises(docker.errors.NotFound):
            live.container.reload()
    finally:
        await live.stop()
        await orphan.stop()


def test_prune_spares_a_build_step_of_a_managed_image() -> None:
    """A ``docker build`` FROM one of reroll's images runs each step in a container that inherits
    the image's ``reroll.managed`` label (the build's own labels reach only the committed image),
    with no run id and no owner: a prune by another process (another job, a test) killed such
    steps (exit 137, seen on two SkillsBench/Terminal-Bench builds of a conformance run)."""
    with contextlib.closing(docker.from_env()) as engine:
        step = engine.containers.run("reroll/base:bookworm", ["sleep", "60"], detach=True, remove=True)
        try:
            assert step.labels.get("reroll.managed") == "1"  # as a build step's
            removed = prune()
            assert step.name not in removed["containers"]
            step.reload()
            assert step.status == "running"
        finally:
            with contextlib.suppress(docker.errors.NotFound):
                step.remove(force=True)


def test_prune_passes_over_a_container_removed_while_it_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container that goes (its rollout ended, another prune took it) between prune's listing
    and its inspection of each one failed the whole ``reroll sandbox prune`` with ``404 No such
    container`` (seen in CI): it is passed over, and the rest of the sweep goes on."""
    run_id = f"prune-race-{uuid.uuid4().hex[:8]}"
    with contextlib.closing(docker.from_env()) as engine:
        labels = {"reroll.managed": "1", "reroll.run_id": run_id}
        leaving = engine.containers.create("reroll/base:bookworm", ["true"], labels=labels)
        inspect = engine.api.inspect_container

        def removed_first(container_id: str) -> Any:
            if container_id == leaving.id:
                engine.api.remove_container(container_id, force=True)
            return inspect(container_id)

        monkeypatch.setattr(engine.api, "inspect_container", removed_first)
        monkeypatch.setattr("reroll.sandbox.docker.prune.docker_client", lambda: engine)
        monkeypatch.setattr(engine, "close", lambda: None)
        removed = prune(run_id)
        assert removed["containers"] == []
        with pytest.raises(docker.errors.NotFound):
            engine.containers.get(leaving.id)


def test_a_machine_wide_prune_spares_a_mount_folder_still_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout makes its mount folder before its container: a prune in between removed the
    folder with the sidecar's token (``cannot read the token file``, seen in CI). A new folder is
    spared by a machine-wide prune; an old one (a killed controller's) is removed, and so is a
    new one when its run is named."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    starting, leftover = tmp_path / "reroll-docker-starting-1", tmp_path / "reroll-docker-killed-1"
    starting.mkdir()
    leftover.mkdir()
    hour_ago = time.time() - 3600
    os.utime(leftover, (hour_ago, hour_ago))
    prune()
    assert starting.is_dir() and not leftover.exists()
    prune("starting-1")
    assert not starting.exists()


async def test_a_task_dockerfile_that_fails_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    task_dir = tmp_path / "broken"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "verifier").mkdir()
    (task_dir / "task.md").write_text("---\nname: broken-env\n---\nNothing to do.\n")
    (task_dir / "verifier" / "test.sh").write_text("#!/bin/sh\n")
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(f"FROM reroll/base:bookworm\nRUN echo broken-{uuid.uuid4().hex} && exit 3\n")
    run_id = f"broken-{uuid.uuid4().hex[:8]}"
    sandbox = DockerSandbox(sandbox_spec(load_task(task_dir)), run_id)
    with pytest.raises(SandboxError, match=rf"docker build of {re.escape(str(dockerfile))} failed.*code: 3"):
        await sandbox.start()
    assert sandbox.container is None
    engine = docker.from_env()
    try:
        assert engine.containers.list(all=True, filters={"label": f"reroll.run_id={run_id}"}) == []
    finally:
        engine.close()


def test_the_cli_reports_image_builds_on_stderr(tmp_path: Path) -> None:
    """A first use builds the task's image (minutes for the base): `reroll run` says so as it goes."""
    task_dir = tmp_path / "hello-file"
    shutil.copytree(EXAMPLES / "hello-file", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + f"RUN echo fresh-{uuid.uuid4().hex}\n")
    reroll = Path(sys.executable).parent / "reroll"
    argv = [
        str(reroll),
        "run",
        str(task_dir),
        "--agent",
        "oracle",
        "--sandbox",
        "docker",
        "--jobs-dir",
        "jobs",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"building images: docker build {dockerfile}\n" in done.stderr
    again = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0 and "building images" not in again.stderr


def test_a_run_overrides_the_tasks_network_policy(tmp_path: Path) -> None:
    """`--network none` puts a task that declares full egress on the internal network."""
    task = EXAMPLES / "word-count"
    assert load_task(task).spec.environment.network == "full"
    reroll = Path(sys.executable).parent / "reroll"
    argv = [str(reroll), "run", str(task), "--agent", "oracle", "--sandbox", "docker", "--network", "none"]
    done = subprocess.run(
        [*argv, "--jobs-dir", "jobs"], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "starting docker sandbox (network none)" in done.stdout
    (run_dir,) = (tmp_path / "jobs").glob("*/*")
    assert json.loads((run_dir / "config.json").read_text())["network"] == "none"
    assert json.loads((run_dir / "result.json").read_text())["rewards"]["reward"] == 1.0


async def test_a_sandbox_started_ahead_is_adopted_by_its_rollouts_own(task: Task) -> None:
    """`reroll branch` starts a child's sandbox ahead (`reroll.sandbox.ahead`); the rollout's own
    object of the same run id, spec and settings adopts it: the same container, no second one."""
    run_id = f"ahead-{uuid.uuid4().hex[:8]}"
    early = DockerSandbox(sandbox_spec(task), run_id)
    assert early.start_ahead()
    sandbox = DockerSandbox(sandbox_spec(task), run_id)
    await sandbox.host_address()  # as the lifecycle does before its start
    try:
        await sandbox.start()
        assert sandbox.container is not None and early.container is not None
        assert sandbox.container.id == early.container.id
        assert labelled_containers(run_id) == [sandbox.container.name]
        assert (await sandbox.exec(["true"])).exit_code == 0
    finally:
        await sandbox.stop()
        await discard_ahead()
    assert labelled_containers(run_id) == []


async def test_a_sandbox_started_ahead_that_differs_is_stopped(task: Task) -> None:
    """One started ahead with other settings (or spec) than the rollout's is never handed over:
    it is removed and the rollout's own starts."""
    run_id = f"ahead-{uuid.uuid4().hex[:8]}"
    early = DockerSandbox(sandbox_spec(task), run_id, DockerSandboxConfig(setup_timeout_seconds=59))
    assert early.start_ahead()
    sandbox = DockerSandbox(sandbox_spec(task), run_id)
    try:
        await sandbox.start()
        assert sandbox.container is not None and early.container is None  # stopped
        assert labelled_containers(run_id) == [sandbox.container.name]
    finally:
        await sandbox.stop()
    assert not DockerSandbox(sandbox_spec(with_network(task, "none")), run_id).start_ahead()
