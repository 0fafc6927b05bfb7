"""``--executor ray`` on a two-node cluster that shares no file system with the controller.

The head node runs on this machine (no CPU, so it runs no rollout); the worker node is a Docker
container with its own file system (host network, so Ray's many ports need no mapping), holding
reroll installed from the wheel into a venv of Debian bookworm's Python 3.11 (the host's minor
version: Ray is told to match minor versions only). Rollouts run there in the ``local-plain``
sandbox; their task folder travels to the container and their run folders come back. The job's
summary must equal a one-node (asyncio) run's.

The worker image is built once per content (base image, wheel, locked requirements, the host's CA
bundle), so the suite builds it once; Docker's layer cache keeps the requirements layer (ray and
the rest from PyPI, through the host's TLS-intercepting proxy) across wheel changes.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from reroll.cache import host_ca_bundle
from reroll.jobs.folder_archive import pack
from reroll.runfolder.summary import JobSummary
from reroll.sandbox.docker.images import BUILD_CA_FILE, ensure_images, trust_host_ca

from tests.conftest import EXAMPLES, ROOT, UV, build_test_image
from tests.jobs.test_ray_executor import comparable, skills_task

pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(900)]  # an image build on first use

pytest.importorskip("ray", reason="ray is not installed: pip install 'reroll[ray]' (in the dev extra)")

BIN = Path(sys.executable).parent
WORKER_VENV = "/opt/reroll"
CLUSTER_ENV = {
    "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL": "minor",
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN": secrets.token_hex(32),
}
"""The environment of every process of the test's cluster (head, worker node, drivers): Ray refuses
a node whose Python differs in the patch version unless told so (3.11.2 vs the host's), and a
cluster gets a token of its own (else Ray would take ``~/.ray/auth_token`` on one side only)."""
OBJECT_STORE_BYTES = 100 * 1024 * 1024
NODE_LOG = "/tmp/ray-node.log"
WORKER_DOCKERFILE = """FROM {base}
COPY requirements.txt /tmp/requirements.txt
RUN python3 -m venv {venv} && {venv}/bin/pip install -q --no-cache-dir -r /tmp/requirements.txt
COPY {wheel} /tmp/{wheel}
RUN {venv}/bin/pip install -q --no-cache-dir --no-deps /tmp/{wheel}
ENV RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor PATH={venv}/bin:$PATH
"""


@pytest.fixture(scope="module")
def worker_image(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The worker node's image: reroll's base image plus a venv with the wheel at the locked versions."""
    requirements = tmp_path_factory.mktemp("requirements") / "requirements.txt"
    # --no-header: the header names the output path, which differs per session (and the image's hash)
    export = [UV, "export", "--quiet", "--frozen", "--no-hashes", "--no-header", "--no-emit-project"]
    export += ["--extra", "ray"]
    subprocess.run([*export, "--project", str(ROOT), "--output-file", str(requirements)], check=True)
    client = docker.from_env()
    try:
        base = ensure_images(client).base
        dockerfile = WORKER_DOCKERFILE.format(base=base, venv=WORKER_VENV, wheel=wheel.name)
        files = {"requirements.txt": requirements.read_bytes(), wheel.name: _stable_zip(wheel)}
        ca = host_ca_bundle()
        if ca is not None:
            dockerfile = trust_host_ca(dockerfile)
            files[BUILD_CA_FILE] = ca.read_bytes()
        return build_test_image(client, "reroll-test/ray-worker", dockerfile, files, network="host")
    finally:
        client.close()


def _stable_zip(wheel: Path) -> bytes:
    """`wheel` zipped again with fixed times, in name order: the same bytes for the same content
    (a wheel built again differs in its times only), so the image is built once, not per session."""
    out = io.BytesIO()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in sorted(source.infolist(), key=lambda member: member.filename):
            copy = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            target.writestr(copy, source.read(info))
    return out.getvalue()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _node_ports() -> list[str]:
    """Free ports for a node's fixed-port services: both nodes share this host's network, and
    other engineers' Ray instances may hold the defaults."""
    return [f"--dashboard-agent-listen-port={_free_port()}", f"--metrics-export-port={_free_port()}"]


def _alive_nodes(address: str) -> int:
    """How many nodes of the cluster at `address` are alive (0 while it cannot be reached)."""
    script = f"import ray; ray.init(address={address!r}, logging_level='ERROR')\n"
    script += "print(sum(node['Alive'] for node in ray.nodes()))"
    done = subprocess.run(
        [str(BIN / "python"), "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | CLUSTER_ENV,
    )
    return int(done.stdout.strip() or 0)


@pytest.fixture(scope="module")
def cluster(worker_image: str) -> Iterator[tuple[str, str]]:
    """``(address, container name)`` of a running two-node cluster: the head here (0 CPUs), the
    worker node in a container (2 CPUs). Both are stopped after the module, by their ids."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp = Path(tempfile.mkdtemp(prefix="rr-ray-", dir="/tmp"))  # short: Ray's socket paths
    head = subprocess.Popen(
        [
            *(str(BIN / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=0"),
            *("--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--include-dashboard=false"),
            *("--disable-usage-stats", f"--object-store-memory={OBJECT_STORE_BYTES}"),
            *(f"--ray-client-server-port={_free_port()}", f"--dashboard-port={_free_port()}"),
            *_node_ports(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ | CLUSTER_ENV,
    )
    container = f"reroll-test-ray-worker-{port}"
    node = [
        *("ray", "start", f"--address={address}", "--node-ip-address=127.0.0.1", "--num-cpus=2"),
        *("--block", "--disable-usage-stats", f"--object-store-memory={OBJECT_STORE_BYTES}"),
        *_node_ports(),
    ]
    try:
        subprocess.run(
            [
                *("docker", "run", "--detach", "--name", container, "--network", "host"),
                *("--shm-size", "256m", "--label", "reroll.managed=1"),
                *(arg for name in CLUSTER_ENV for arg in ("--env", name)),  # values from this environment
                *(worker_image, "sh", "-c", f"exec {shlex.join(node)} >{NODE_LOG} 2>&1"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
            env=os.environ | CLUSTER_ENV,
        )
        deadline = time.monotonic() + 180
        while _alive_nodes(address) < 2:
            assert time.monotonic() < deadline, f"the worker node did not join in 180 s: {_logs(container)}"
            assert head.poll() is None, "the head node exited"
            time.sleep(2)
        yield address, container
    finally:
        subprocess.run(["docker", "rm", "--force", container], capture_output=True, timeout=60)
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:  # `ray start --block` may outlive its children
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=20)
        _kill_leftovers(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _logs(container: str) -> str:
    """The end of the worker node's ``ray start`` output (``docker logs`` may be off on the host)."""
    with tempfile.TemporaryDirectory() as folder:
        copy = ["docker", "cp", f"{container}:{NODE_LOG}", folder]
        subprocess.run(copy, capture_output=True, timeout=60)
        log = Path(folder) / Path(NODE_LOG).name
        return log.read_text()[-3000:] if log.is_file() else "(no log)"


def _kill_leftovers(temp: Path) -> None:
    """SIGKILL what is left of the head node's processes (they name `temp` on their command line)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(temp).encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _job(
    name: str,
    cwd: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    task: Path = EXAMPLES / "hello-file",
    repeats: int = 3,
) -> JobSummary:
    """``reroll job`` of `repeats` oracle rollouts of `task` on ``local-plain`` (`env` added to
    the environment); its summary."""
    argv = [
        *(str(BIN / "reroll"), "job", "--task", str(task), "--agent", "oracle", "--repeats", str(repeats)),
        *("--concurrency", "2", "--sandbox", "local-plain", "--job-name", name, *extra),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=cwd, timeout=600, env=os.environ | CLUSTER_ENV | (env or {})
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return JobSummary.model_validate_json((cwd / "jobs" / name / "summary.json").read_bytes())


def test_two_node_job_equals_a_one_node_job(cluster: tuple[str, str], tmp_path: Path) -> None:
    """The rollouts run in the container (the head has no CPU); the summary equals an in-process
    run's, every run folder came back whole, and the task folder sits in the worker's cache."""
    address, container = cluster
    started = time.monotonic()
    # The cluster named by RAY_ADDRESS, as docs/jobs.md says.
    on_cluster = _job("two", tmp_path, "--executor", "ray", env={"RAY_ADDRESS": address})
    seconds = time.monotonic() - started
    one_node = _job("one", tmp_path)
    assert comparable(on_cluster) == comparable(one_node)
    assert on_cluster.totals.status_counts == {"ok": 3}
    runs = [tmp_path / "jobs" / "two" / rollout.name for rollout in on_cluster.rollouts]
    for run in runs:
        assert json.loads((run / "result.json").read_text())["rewards"] == {"reward": 1.0}
        assert (run / "config.json").is_file()
    task = pack(EXAMPLES / "hello-file")
    cached = subprocess.run(
        ["docker", "exec", container, "ls", f"/root/.cache/reroll/ray/folders/{task.digest}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "task.md" in cached.stdout.split(), cached.stdout + cached.stderr
    sizes = [len(pack(run).data) for run in runs]
    print(f"\ntwo-node job: {seconds:.1f} s; task archive {len(task.data)} B; run folders {sizes} B")


def test_a_skills_dir_travels_to_the_worker_node(cluster: tuple[str, str], tmp_path: Path) -> None:
    """``--skills with-skill --skills-dir DIR``, DIR outside the task: it reaches the container's
    cache, the oracle there reads the skill in its sandbox (reward 1), and the run folder that
    came back names the controller's task and skills folders."""
    address, container = cluster
    task, skills = skills_task(tmp_path / "in")
    extra = ("--executor", "ray", "--skills", "with-skill", "--skills-dir", str(skills))
    summary = _job("skills", tmp_path, *extra, env={"RAY_ADDRESS": address}, task=task, repeats=1)
    (rollout,) = summary.rollouts
    assert (rollout.status, rollout.rewards) == ("ok", {"reward": 1.0})
    config = json.loads((tmp_path / "jobs" / "skills" / rollout.name / "config.json").read_text())
    assert (config["task_path"], config["effective_skills_dir"]) == (str(task), str(skills))
    cached = subprocess.run(
        ["docker", "exec", container, "ls", f"/root/.cache/reroll/ray/folders/{pack(skills).digest}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cached.stdout.split() == ["greeting"], cached.stdout + cached.stderr
