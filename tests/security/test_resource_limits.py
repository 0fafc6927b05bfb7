"""Red team, issue 12 item 4: an agent that fills the disk or allocates beyond its memory ends
the rollout with status ``error``, category ``resource_limit`` (not retried) and a message naming
the limit, and the host's disk grows by at most the quota; the honest agent still scores 1.

Before the sized file system (`reroll.sandbox.docker.disk`) an agent wrote 4 GiB into the workspace,
a volume of the host's file system; an agent killed by the OOM killer ended as ``agent_error``.

Issue 19 item 3, the same on the isolated `local` sandbox (`reroll.sandbox.local.cgroups`): before its
cgroup an agent of a task with ``memory_mb = 1024`` touched 1.5 GiB, wrote 1 GiB into ``/tmp``
and 256 MiB into ``/dev/shm`` (tmpfs of half the host's RAM each) and ran 400 processes, all
without a limit; and ``cpus`` was not enforced.

Issue 32: the isolated `local` sandbox's workspace, logs and home were host folders bound in, so
an agent could fill the host's disk through them; now they share the sized ``/`` of ``storage_mb``.
On docker, a root agent wrote 200 MiB into ``/opt`` past a quota of 64 MiB — the container's own
layer, on the host's disk — and its rollout ended ``ok``; now that layer is on the sized file
system too (`reroll.sandbox.docker.layer`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.local.cgroups import CgroupError, detect
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.rootview import namespaces_unavailable
from reroll.tasks.task import load_task

from tests.conftest import EXAMPLES
from tests.e2e.test_reward_hacks import run_oracle, write_files

pytestmark = [pytest.mark.slow, pytest.mark.spawns]
REROLL = str(Path(sys.executable).parent / "reroll")
STORAGE_MB = 64
MEMORY_MB = 256

ATTACKS = {
    "honest": "echo 42 > answer.txt\n",
    # Writes until ENOSPC (dd fails then: the agent exits 1), in the workspace and in /tmp.
    "fill-disk": (
        "dd if=/dev/zero of=/tmp/fill bs=1M count=1000 || true\ndd if=/dev/zero of=big bs=1M count=1000\n"
    ),
    # Issue 32: the logs folder and HOME were in the container's own layer, on the host's disk.
    "fill-logs": f"dd if=/dev/zero of=/logs/agent/fill bs=1M count={STORAGE_MB + 10}\n",
    "fill-home": f"dd if=/dev/zero of=$HOME/fill bs=1M count={STORAGE_MB + 10}\n",
    "allocate-memory": 'python3 -c "x = bytearray(1 << 30)"\n',
    # Issue 32: as root, outside the sized folders, in the container's own layer.
    "fill-layer-as-root": f"dd if=/dev/zero of=/opt/fill bs=1M count={STORAGE_MB + 10}\n",
}


def _cgroups_here() -> bool:
    try:
        return os.geteuid() == 0 and bool(detect())
    except CgroupError:
        return False


def make_task(root: Path, attack: str) -> Path:
    front = {
        "name": "limits-attack",
        "verifier": {"timeout_sec": 60},
        "environment": {"network": "none", "storage_mb": STORAGE_MB, "memory_mb": MEMORY_MB},
    }
    if attack.endswith("as-root"):
        front["agent"] = {"user": "root"}
    files = {
        "task.md": f"---\n{json.dumps(front)}\n---\nWrite 42 into answer.txt.\n",
        "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n",
        "verifier/test.sh": "#!/bin/sh\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
        "oracle/solve.sh": f"#!/bin/sh\nset -e\ncd /app\n{ATTACKS[attack]}",
    }
    return write_files(root / attack, files)


@pytest.mark.usefixtures("docker_images")
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_limit_ends_the_rollout_clearly(attack: str, tmp_path: Path) -> None:
    result, _ = run_oracle(make_task(tmp_path, attack), tmp_path)
    if attack == "honest":
        assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
        return
    assert (result["status"], result["error_category"]) == ("error", "resource_limit"), result
    # Never paid. With a btrfs disk (copy-on-write) a full one refuses even the reward file, as
    # local's: no reward then; on ext4 the verifier still writes its 0.
    assert result["rewards"] in (None, {"reward": 0.0}), "paid all the same"
    expected = "out of disk" if attack.startswith("fill") else "out of memory"
    field = "storage_mb" if attack.startswith("fill") else "memory_mb"
    assert expected in result["error"] and f"environment.{field}" in result["error"], result["error"]


def quota_sandbox(*, copy_on_write: bool = True) -> DockerSandbox:
    """An unstarted docker sandbox of ``hello-file`` with a quota of `STORAGE_MB` (on btrfs where
    btrfs-progs is installed, unless not `copy_on_write`)."""
    task = load_task(EXAMPLES / "hello-file")
    environment = task.spec.environment.model_copy(update={"storage_mb": STORAGE_MB})
    task = task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    run_id = f"limits-{uuid.uuid4().hex[:8]}"
    config = DockerSandboxConfig(image="reroll/base:bookworm", copy_on_write=copy_on_write)
    return DockerSandbox(sandbox_spec(task), run_id, config)


@pytest.mark.usefixtures("docker_images")
async def test_the_host_disk_grows_by_at_most_the_quota() -> None:
    sandbox = quota_sandbox()
    await sandbox.start()
    try:
        assert sandbox._disk is not None
        image = sandbox._disk.folder / "disk.img"
        before = os.stat(image).st_blocks * 512
        files = f"/app/a /tmp/b /logs/agent/c {sandbox.layout.home}/d"
        fill = f"for f in {files}; do dd if=/dev/urandom of=$f bs=1M count=200 2>&1; done"
        result = await sandbox.exec(["sh", "-c", fill], user=sandbox.layout.agent_user, timeout_seconds=120)
        assert b"No space left on device" in result.stdout, result.output_text()
        grown = os.stat(image).st_blocks * 512 - before
        assert STORAGE_MB << 19 < grown <= STORAGE_MB << 20, grown  # filled, and no more
        assert len(await sandbox.limits_hit()) == 1
        await sandbox.exec(["sh", "-c", f"rm -f {files}"])
        await asyncio.sleep(0.5)
        assert await sandbox.limits_hit() == []
    finally:
        await sandbox.stop()
    assert not sandbox._disk and not image.parent.exists(), "unmounted and deleted with the sandbox"


def mounted_device(mountpoint: Path) -> str:
    """The ``major:minor`` of the file system mounted at `mountpoint` (/proc/self/mountinfo)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return next(line.split()[2] for line in reversed(lines) if line.split()[4] == str(mountpoint))


@pytest.mark.usefixtures("docker_images")
async def test_a_root_fill_of_the_container_layer_stays_on_the_quota() -> None:
    # ext4: on btrfs the blocks of a file deleted from the layer did not come back within 20 s
    # (fuse-overlayfs holding the unlinked file open?), so the quota stayed full (open, issue 31).
    sandbox = quota_sandbox(copy_on_write=False)
    await sandbox.start()
    try:
        assert sandbox._disk is not None and sandbox._layer is not None
        image, upper = sandbox._disk.folder / "disk.img", sandbox._layer / "diff"
        on_quota = mounted_device(sandbox._layer) == mounted_device(sandbox._disk.mountpoint)
        assert on_quota, "the layer is on the quota"  # (btrfs: a subvolume of it, with its own st_dev)
        before = os.stat(image).st_blocks * 512
        files = "/opt/a /usr/local/b /var/c /etc/d"
        fill = f"for f in {files}; do dd if=/dev/urandom of=$f bs=1M count=100 2>&1; done"
        result = await sandbox.exec(["sh", "-c", fill], timeout_seconds=120)  # as root
        assert b"No space left on device" in result.stdout, result.output_text()
        grown = os.stat(image).st_blocks * 512 - before
        assert STORAGE_MB << 19 < grown <= STORAGE_MB << 20, grown  # filled, and no more
        (hit,) = await sandbox.limits_hit()
        assert "container's own layer" in hit and "environment.storage_mb" in hit, hit
        await sandbox.exec(["sh", "-c", f"rm -f {files}"])
        await asyncio.sleep(0.5)
        assert await sandbox.limits_hit() == []
        delete = "rm /usr/bin/tail && mkdir -p /usr/local/lib/x && ls /usr/bin/tail"
        gone = await sandbox.exec(["sh", "-c", delete])
        assert gone.exit_code != 0 and b"No such file" in gone.stderr, "a lower file deleted (a whiteout)"
    finally:
        await sandbox.stop()
    assert not upper.parent.exists(), "the layer goes with the container"
    assert str(upper.parent) not in Path("/proc/mounts").read_text(), "no mount left behind"
    assert not image.parent.exists(), "unmounted and deleted with the sandbox"


LOCAL_MEMORY_MB = 1024
LOCAL_PIDS_MAX = 128
LOCAL_STORAGE_MB = 64
LOCAL_ATTACKS = {  # attack → its script, and what result.json's error must say
    "honest": ("echo 42 > answer.txt\n", ()),
    "touch-memory": ("python3 -c \"x = b'x' * (1536 << 20)\"\n", ("out of memory", "environment.memory_mb")),
    # 40 forks of 40 MiB each: the sidecar (about 50 MiB) is the largest process, so the OOM
    # killer ends it first, and with it the sandbox.
    "many-small-processes": (
        'python3 -c "import os, time\nfor _ in range(40):\n'
        "    if os.fork() == 0: x = b'x' * (30 << 20); time.sleep(10); os._exit(0)\nos.wait()\"\n",
        ("out of memory", "environment.memory_mb"),
    ),
    **{
        f"fill-{where}": (
            f"dd if=/dev/zero of={path}/fill bs=1M count={LOCAL_STORAGE_MB + 10}\n",
            ("out of storage", f"its {LOCAL_STORAGE_MB} MiB", "environment.storage_mb"),
        )
        for where, path in {
            "tmp": "/tmp",
            "workspace": "/app",
            "logs": "/logs/agent",
            "home": "$HOME",
        }.items()
    },
    "fill-shm": (
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count=256\n",
        ("out of storage: /dev/shm is full", "environment.memory_mb"),
    ),
    "fork-400": (  # in Python: bash retries a refused fork for seconds
        'python3 -c "import os, time\nfor _ in range(400):\n'
        '    if os.fork() == 0: time.sleep(60); os._exit(0)"\n',
        ("out of processes", f"limit of {LOCAL_PIDS_MAX} processes", "environment.pids_max"),
    ),
}


def make_local_task(root: Path, attack: str) -> Path:
    front = {
        "name": "local-limits-attack",
        "verifier": {"timeout_sec": 60},
        "agent": {"timeout_sec": 120},
        "environment": {
            "network": "none",
            "memory_mb": LOCAL_MEMORY_MB,
            "pids_max": LOCAL_PIDS_MAX,
            "storage_mb": LOCAL_STORAGE_MB,
        },
    }
    files = {
        "task.md": f"---\n{json.dumps(front)}\n---\nWrite 42 into answer.txt.\n",
        "verifier/test.sh": "#!/bin/sh\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n',
        "oracle/solve.sh": f"#!/bin/sh\nset -e\ncd /app\n{LOCAL_ATTACKS[attack][0]}",
    }
    return write_files(root / attack, files)


@pytest.mark.skipif(bool(namespaces_unavailable()), reason="this machine forbids the isolated local sandbox")
@pytest.mark.skipif(not _cgroups_here(), reason="no cgroup can be made here (not root, or no hierarchy)")
@pytest.mark.parametrize("attack", list(LOCAL_ATTACKS))
def test_a_limit_ends_a_local_rollout_clearly(attack: str, tmp_path: Path) -> None:
    result, _ = run_oracle(make_local_task(tmp_path, attack), tmp_path, backend="local")
    if attack == "honest":
        assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
        return
    assert (result["status"], result["error_category"]) == ("error", "resource_limit"), result
    assert result["rewards"] in (None, {"reward": 0.0}), "paid all the same"
    for words in LOCAL_ATTACKS[attack][1]:
        assert words in result["error"], result["error"]


@pytest.mark.skipif(bool(namespaces_unavailable()), reason="this machine forbids the isolated local sandbox")
async def test_a_local_fill_grows_the_host_disk_by_at_most_the_quota() -> None:
    task = load_task(EXAMPLES / "hello-file")
    environment = task.spec.environment.model_copy(update={"storage_mb": LOCAL_STORAGE_MB})
    task = task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    sandbox = IsolatedSandbox(sandbox_spec(task), f"limits-{uuid.uuid4().hex[:8]}")
    await sandbox.start()
    try:
        assert sandbox._storage is not None
        image, folder = sandbox._storage.disk.folder / "disk.img", sandbox.folder
        before = os.stat(image).st_blocks * 512
        fill = " ; ".join(
            f"dd if=/dev/urandom of={path}/fill bs=1M count={LOCAL_STORAGE_MB} 2>&1"
            for path in (sandbox.layout.workspace, f"{sandbox.layout.logs_dir}/agent", "$HOME", "/tmp")
        )
        result = await sandbox.exec(["sh", "-c", fill], user=sandbox.layout.agent_user, timeout_seconds=120)
        assert b"No space left on device" in result.stdout, result.output_text()
        grown = os.stat(image).st_blocks * 512 - before
        assert LOCAL_STORAGE_MB << 19 < grown <= LOCAL_STORAGE_MB << 20, grown  # filled, and no more
        written = sum(path.stat().st_blocks * 512 for path in folder.rglob("*") if path.is_file())
        assert written < 1 << 20, "nothing of it in the sandbox's host folder"
        hit = await sandbox.limits_hit()
        assert len(hit) == 1 and "environment.storage_mb" in hit[0], hit
    finally:
        await sandbox.stop()
    assert sandbox._storage is None and not image.parent.exists(), "unmounted and deleted with the sandbox"
    assert "environment.storage_mb" in (await sandbox.limits_hit())[0], "what was hit when it stopped"


SPIN = """
import multiprocessing, os, time
def spin():
    start = time.monotonic()
    while time.monotonic() - start < 1.5:
        pass
workers = [multiprocessing.Process(target=spin) for _ in range(2)]
start = time.monotonic()
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
times = os.times()
print(times.children_user + times.children_system, time.monotonic() - start)
"""


@pytest.mark.skipif(bool(namespaces_unavailable()), reason="this machine forbids the isolated local sandbox")
@pytest.mark.skipif(not _cgroups_here(), reason="no cgroup can be made here (not root, or no hierarchy)")
async def test_local_cpus_cap_cpu_time_and_the_cgroup_goes_with_the_sandbox() -> None:
    task = load_task(EXAMPLES / "hello-file")
    environment = task.spec.environment.model_copy(update={"cpus": 0.5})
    task = task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})
    sandbox = IsolatedSandbox(sandbox_spec(task), f"limits-{uuid.uuid4().hex[:8]}")
    await sandbox.start()
    try:
        assert sandbox._cgroup is not None
        folders = list(sandbox._cgroup.paths.values())
        assert all(folder.is_dir() for folder in folders)
        result = await sandbox.exec(["python3", "-c", SPIN], user=sandbox.layout.agent_user)
        cpu, wall = map(float, result.stdout.split())
        assert cpu <= 0.5 * wall * 1.2, (cpu, wall)  # two busy processes: unlimited, twice the wall time
        await sandbox.exec(["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 &"], user=sandbox.layout.agent_user)
    finally:
        await sandbox.stop()
    assert not any(folder.exists() for folder in folders), "the cgroup goes with the sandbox"
