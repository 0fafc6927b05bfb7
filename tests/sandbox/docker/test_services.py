"""Image services on docker: Harbor's compose form run end to end by the oracle (a sibling
container reached by its name, its log in the run folder, nothing left behind), and under
network ``none`` a service reaches its own rollout but neither the host nor another rollout's
service."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from reroll.environment.services import Environment
from reroll.rollout.lifecycle import sandbox_env
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.prune import prune
from reroll.tasks.task import Task, load_task

from tests.conftest import labelled_containers
from tests.environment.test_services import live_service_run, reset_trial_run
from tests.sandbox.docker.test_backend import CONNECT_SCRIPT

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images")]
REROLL = str(Path(sys.executable).parent / "reroll")
IMAGE = "reroll/base:bookworm"
WEB = "mkdir -p /srv && echo hello-from-web > /srv/index.html && cd /srv && exec python3 -m http.server 8000"
HEALTH = ["CMD-SHELL", "python3 -c \"import urllib.request as u; u.urlopen('http://localhost:8000/')\""]


def compose_task(folder: Path, network: str) -> Path:
    """A Harbor-layout task: the sandbox built from its Dockerfile, a ``web`` service from compose."""
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "environment" / "Dockerfile").write_text(f"FROM {IMAGE}\nWORKDIR /app\n")
    compose = {
        "services": {
            "main": {"build": {"context": "."}},
            "web": {"image": IMAGE, "command": WEB, "healthcheck": {"test": HEALTH, "interval": "1s"}},
        }
    }
    (folder / "environment" / "docker-compose.yaml").write_text(yaml.safe_dump(compose))
    (folder / "task.toml").write_text(
        f'[environment]\nnetwork_mode = "{network}"\n[agent]\ntimeout_sec = 60\n'
    )
    (folder / "instruction.md").write_text("Fetch the web service's page.\n")
    (folder / "solution" / "solve.sh").write_text(
        "python3 -c \"import urllib.request as u; open('/app/seen.txt','w').write("
        "u.urlopen('http://web:8000/index.html').read().decode())\"\n"
    )
    (folder / "tests" / "test.sh").write_text(
        "grep -q hello-from-web /app/seen.txt && echo 1 > /logs/verifier/reward.txt\n"
    )
    return folder


def test_a_compose_service_runs_as_a_sibling_container(tmp_path: Path) -> None:
    task = compose_task(tmp_path / "task", "no-network")
    args = ["run", str(task), "--agent", "oracle", "--sandbox", "docker", "--job-name", "j"]
    done = subprocess.run(
        [REROLL, *args, "--jobs-dir", str(tmp_path / "jobs")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    (record,) = json.loads((run / "services" / "services.json").read_text())
    assert (record["name"], record["runs"]) == ("web", "image")
    assert "GET /index.html" in (run / "services" / "web.log").read_text()  # http.server's access log
    assert labelled_containers(run.name) == []  # the sibling removed with the sandbox


@pytest.fixture
async def two_rollouts(tmp_path: Path) -> AsyncIterator[list[tuple[DockerSandbox, Environment]]]:
    """Two rollouts of one task under network none, each with its ``web`` service ready."""
    task: Task = load_task(compose_task(tmp_path / "task", "no-network"))
    rollouts: list[tuple[DockerSandbox, Environment]] = []
    try:
        for index in range(2):
            sandbox = DockerSandbox(sandbox_spec(task), f"svc-{index}-{uuid.uuid4().hex[:8]}")
            await sandbox.start()
            run_dir = tmp_path / f"run{index}"
            run_dir.mkdir()
            environment = Environment(sandbox, task, run_dir, sandbox_env(sandbox))
            rollouts.append((sandbox, environment))
            await environment.provision()
            await environment.wait_ready()
        yield rollouts
    finally:
        for sandbox, environment in rollouts:
            await environment.teardown()
            await sandbox.stop()


async def service_connect(sandbox: DockerSandbox, host: str, port: int) -> str:
    (container,) = sandbox._siblings
    _, output = await asyncio.to_thread(
        container.exec_run, ["python3", "-c", CONNECT_SCRIPT, host, str(port)]
    )
    assert isinstance(output, bytes)
    return output.decode().strip()


def address(sandbox: DockerSandbox) -> str:
    (container,) = sandbox._siblings
    container.reload()
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    return str(network["IPAddress"])


async def test_under_network_none_a_service_reaches_neither_the_host_nor_another_rollout(
    two_rollouts: list[tuple[DockerSandbox, Environment]],
) -> None:
    (first, _), (second, _) = two_rollouts
    page = await first.exec(
        ["python3", "-c", "import urllib.request as u; print(u.urlopen('http://web:8000/').status)"]
    )
    assert page.stdout.strip() == b"200", page.output_text()  # its own service, by name
    host = await first.host_address()
    with socket.create_server((host, 0)) as closed, socket.create_server(("0.0.0.0", 0)) as everywhere:
        assert await service_connect(first, address(first), 8000) == "connected"
        assert await service_connect(first, host, closed.getsockname()[1]) != "connected"  # the host
        assert await service_connect(first, host, everywhere.getsockname()[1]) != "connected"
        assert await service_connect(first, "192.0.2.1", 80) != "connected"  # the internet
        assert await service_connect(first, address(second), 8000) != "connected"  # another rollout's
        result = await first.exec(
            ["python3", "-c", CONNECT_SCRIPT, address(second), "8000"], timeout_seconds=20
        )
        assert result.output_text().strip() != "connected"  # nor from its sandbox


def test_an_image_that_owns_its_lifecycle_is_started_and_gated(tmp_path: Path) -> None:
    """chi-bench's archetype: its manifest says the image's entrypoint starts the services; reroll
    starts that entrypoint (the sidecar took its place), tells it the task by an env var, and
    gates the agent on the manifest's readiness probe."""
    folder = tmp_path / "chi-task"
    (folder / "environment").mkdir(parents=True)
    (folder / "verifier").mkdir()
    (folder / "oracle").mkdir()
    (folder / "environment" / "Dockerfile").write_text(
        f"FROM {IMAGE}\nWORKDIR /app\n"
        'CMD ["sh", "-c", "echo serving $CHI_TASK; sleep 2; cd /tmp && exec python3 -m http.server 8023"]\n'
    )
    (folder / "environment.toml").write_text(
        '[environment]\nname = "chi"\nbase_image = "x"\n'
        '[environment.task_selection]\nkey = "CHI_TASK"\n'
        '[environment.readiness]\nhttp = ["http://localhost:8023/"]\ntimeout_sec = 60\n'
    )
    (folder / "task.md").write_text("---\nname: chi-one\n---\nFetch it.\n")
    (folder / "oracle" / "solve.sh").write_text(
        "python3 -c \"import urllib.request as u; u.urlopen('http://localhost:8023/')\" && touch /app/done\n"
    )
    (folder / "verifier" / "test.sh").write_text("test -e /app/done && echo 1 > /logs/verifier/reward.txt\n")
    args = ["run", str(folder), "--agent", "oracle", "--sandbox", "docker", "--job-name", "j"]
    done = subprocess.run(
        [REROLL, *args, "--jobs-dir", str(tmp_path / "jobs")], capture_output=True, text=True, timeout=900
    )
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    assert "serving chi-one" in (run / "services" / "entrypoint.log").read_text()


async def test_prune_removes_the_services_of_a_killed_controller(tmp_path: Path) -> None:
    """A controller killed mid-rollout leaves the sandbox, its service and its network: `reroll
    sandbox prune` (here for that run) removes all three, the sibling by its labels."""
    task = load_task(compose_task(tmp_path / "task", "public"))
    sandbox = DockerSandbox(sandbox_spec(task), f"svc-prune-{uuid.uuid4().hex[:8]}")
    await sandbox.start()
    try:
        environment = Environment(sandbox, task, tmp_path, sandbox_env(sandbox))
        await environment.provision()
        await environment.wait_ready()
        network = sandbox._network
        assert network is not None and str(network.name).startswith("reroll-services-")
        assert len(labelled_containers(sandbox.run_id)) == 2  # the sandbox and its web service
        await sandbox.disconnect()  # the controller dies: nothing is stopped
        removed = await asyncio.to_thread(prune, sandbox.run_id)
        assert len(removed["containers"]) == 2 and removed["networks"] == [network.name]
        assert labelled_containers(sandbox.run_id) == []
    finally:
        await sandbox.stop()


def test_the_verifier_queries_a_live_command_service_while_the_agents_processes_are_dead(
    tmp_path: Path,
) -> None:
    """As on `local` (tests/environment/test_services.py): the command service in the container
    outlives the agent's quiesce and the verify's hardening, the agent's tamperer and impostor
    of the service do not — here the agent may gain root through a setuid program (no
    ``no-new-privileges``), which the quiesce by descent kills too."""
    live_service_run(tmp_path, "docker")


def test_a_scene_that_resets_the_environment_starts_from_its_baseline(tmp_path: Path) -> None:
    """As on `local`: BenchFlow's ``reset()`` before the second scene restarts the manifest's
    service in the container and restores its SQLite state to the setup command's seed."""
    result, run = reset_trial_run(tmp_path, "docker", reset=True)
    assert result["status"] == "ok", result.get("error")
    assert (run / "verifier" / "count.txt").read_text().strip() == "11"
    assert result["rewards"] == {"reward": 1.0}
    assert (run / "services" / "counter.log").read_text().count("serving") == 2
    assert not labelled_containers(run.name)
