"""Copy-on-write snapshots and pools of the docker sandbox (`reroll.sandbox.docker.cowdisk`), on
real containers: a restore in the container is a writable layer of its own; children start from
a kept snapshot each over its own layer, with the container's own layer (outside the sized
folders) carried over; a frozen layer is never writable by a child; a child never sees another
child's writes."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker import disk
from reroll.sandbox.docker.backend import DockerSandbox
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.cowdisk import LAYER
from reroll.sandbox.local import cow, storage
from reroll.tasks.task import Task
from reroll_contracts.errors import SandboxError

from tests.conftest import NEEDS_BTRFS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("docker_images"), *NEEDS_BTRFS]


async def record_pool(task: Task) -> storage.PoolSnapshot:
    """A container that writes step-3's state (in the workspace, HOME, /tmp and its own layer),
    takes a pool snapshot, goes on to a final state and stops: the pool's snapshot."""
    run_id = f"cow-record-{uuid.uuid4().hex[:6]}"
    async with DockerSandbox(sandbox_spec(task), run_id) as sandbox:
        workspace, home = sandbox.layout.workspace, sandbox.layout.home
        state = f"echo 3 > {workspace}/state && echo s3 > {home}/session && echo t3 > /tmp/t"
        layer = "echo l3 > /etc/reroll-layer && rm /etc/issue"
        assert (await sandbox.exec(["sh", "-c", f"{state} && {layer}"])).exit_code == 0
        reference = await sandbox.pool_snapshot("step-3")
        assert reference is not None
        final = f"echo final > {workspace}/state && echo final > /etc/reroll-layer && echo i > /etc/issue"
        await sandbox.exec(["sh", "-c", final])
    return storage.PoolSnapshot.parse(reference)


async def test_a_restore_in_the_container_is_a_fresh_writable_layer_over_the_frozen_one(task: Task) -> None:
    async with DockerSandbox(sandbox_spec(task), f"cow-restore-{uuid.uuid4().hex[:6]}") as sandbox:
        assert sandbox._cow is not None  # btrfs where btrfs-progs is installed
        workspace = sandbox.layout.workspace
        await sandbox.exec(["sh", "-c", f"echo 1 > {workspace}/f"])
        await sandbox.snapshot("one")
        frozen = sandbox._cow.base / cow.SNAPSHOTS / "one" / "0" / "app" / "f"
        with pytest.raises(OSError):
            frozen.write_bytes(b"host")  # read-only to the kernel, whoever asks
        for attempt in range(2):
            await sandbox.exec(["sh", "-c", f"echo {attempt}x > {workspace}/f && touch {workspace}/new"])
            assert await sandbox.restore("one") == [workspace]
            assert await sandbox.get_file(f"{workspace}/f") == b"1\n"
            assert (await sandbox.exec(["test", "-e", f"{workspace}/new"])).exit_code == 1
        assert frozen.read_bytes() == b"1\n"
        await sandbox.snapshot("two")  # after a restore: of the restored subvolume
        assert sandbox._cow.has("two")
        await sandbox.exec(["sh", "-c", f"echo 2 > {workspace}/f"])
        await sandbox.restore("two")
        assert await sandbox.get_file(f"{workspace}/f") == b"1\n"
        for name, paths in (("tar", ["/etc"]), ("mixed", [workspace, "/tmp"])):
            await sandbox.snapshot(name, paths)  # not a sized folder, or two subvolumes now: tar
            assert not sandbox._cow.has(name)


async def test_children_start_from_a_kept_snapshot_each_over_its_own_layer(task: Task) -> None:
    source = await record_pool(task)
    try:
        assert (source.pool / storage.KEPT).is_file() and cow.is_subvolume(source.frozen / LAYER)
        spec, config = sandbox_spec(task), DockerSandboxConfig(from_snapshot=str(source))
        first, second = children = [DockerSandbox(spec, f"cow-child-{i}", config) for i in "ab"]
        await asyncio.gather(first.start(), second.start())  # at once, from one frozen layer
        try:
            workspace, home = first.layout.workspace, first.layout.home
            for child in children:  # the state at step 3, not the final one, layer included
                assert await child.get_file(f"{workspace}/state") == b"3\n"
                assert await child.get_file(f"{home}/session") == b"s3\n"
                assert await child.get_file("/tmp/t") == b"t3\n"
                assert await child.get_file("/etc/reroll-layer") == b"l3\n"
                assert (await child.exec(["test", "-e", "/etc/issue"])).exit_code == 1  # a whiteout
            await first.exec(
                ["sh", "-c", f"echo first > {workspace}/state && echo first > /etc/reroll-layer"]
            )
            await first.exec(["sh", "-c", f"echo x > {home}/mine && echo x > /tmp/mine"])
            assert await second.get_file(f"{workspace}/state") == b"3\n"  # never the other's writes
            assert await second.get_file("/etc/reroll-layer") == b"l3\n"
            for path in (f"{home}/mine", "/tmp/mine"):
                assert (await second.exec(["test", "-e", path])).exit_code == 1
            frozen = source.frozen / "0" / "app" / "state"
            assert frozen.read_bytes() == b"3\n"
            with pytest.raises(OSError):
                frozen.write_bytes(b"host")
        finally:
            await asyncio.gather(*(child.stop() for child in children))
        assert not any((source.pool / disk.MOUNTPOINT / storage.CHILDREN).iterdir())
        assert (source.frozen / LAYER / "etc" / "reroll-layer").read_bytes() == b"l3\n"
    finally:
        disk.remove(source.pool)


async def test_a_child_cannot_reach_the_frozen_layer_from_inside(task: Task) -> None:
    source = await record_pool(task)
    try:
        config = DockerSandboxConfig(from_snapshot=str(source))
        async with DockerSandbox(sandbox_spec(task), "cow-attack", config) as child:
            # Root in the container: find every mount and try to write through each; the pool's
            # frozen snapshots are mounted nowhere in it, and the disk itself is not.
            mounts = (await child.get_file("/proc/self/mountinfo")).decode()
            roots = [line.split()[3] for line in mounts.splitlines()]
            assert not any(root.startswith(f"/{cow.SNAPSHOTS}") for root in roots)
            attack = "for m in $(awk '{print $5}' /proc/self/mountinfo); do echo x > $m/pwn; done"
            await child.exec(["sh", "-c", f"{attack} 2>/dev/null; mount -t btrfs /dev/loop0 /mnt; true"])
        assert not (source.frozen / "0" / "app" / "pwn").exists()
        assert not any(name == "pwn" for name in os.listdir(source.frozen / LAYER))
        assert (source.frozen / "0" / "app" / "state").read_bytes() == b"3\n"
    finally:
        disk.remove(source.pool)


async def test_a_start_from_another_backends_pool_or_no_snapshot_fails(task: Task, tmp_path: object) -> None:
    for text in (f"{tmp_path}:step-3", "step-3"):
        sandbox = DockerSandbox(sandbox_spec(task), "cow-bad", DockerSandboxConfig(from_snapshot=text))
        with pytest.raises(SandboxError, match="no snapshot"):
            await sandbox.start()
        assert sandbox.container is None and sandbox._disk is None
