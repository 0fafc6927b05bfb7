"""Snapshots that outlive their sandbox (`reroll.sandbox.local.storage`): a sandbox kept as a pool
holds only its frozen snapshots; children start from one at the same time, each over a writable
layer of its own; the frozen layer is never writable; prune keeps a pool for its retention time."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker import disk
from reroll.sandbox.local import cow, rootview, storage
from reroll.sandbox.local.backend import local_sandbox
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.tasks.task import Task
from reroll_contracts.errors import SandboxError

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(not cow.available(), reason="btrfs-progs (mkfs.btrfs) is not installed"),
]


async def record_pool(task: Task, run_id: str) -> storage.PoolSnapshot:
    """A sandbox that writes step-3's state, snapshots it, goes on to a final state, and stops
    keeping its snapshots: the pool and the snapshot."""
    config = IsolatedSandboxConfig(keep_snapshots=True)
    async with IsolatedSandbox(sandbox_spec(task), run_id, config) as sandbox:
        workspace, home = sandbox.layout.workspace, sandbox.layout.home
        await sandbox.exec(["sh", "-c", f"echo 3 > {workspace}/state && echo s3 > {home}/session"])
        await sandbox.snapshot("step-3", [workspace, home])
        await sandbox.exec(["sh", "-c", f"echo final > {workspace}/state && echo final > {home}/session"])
        assert sandbox._storage is not None
        pool = sandbox._storage.disk.folder
    return storage.PoolSnapshot(pool, "step-3")


async def test_children_start_at_once_from_a_kept_snapshot_each_over_its_own_layer(task: Task) -> None:
    source = await record_pool(task, "pool-record")
    try:
        mount = source.pool / disk.MOUNTPOINT
        assert (source.pool / storage.KEPT).is_file() and os.path.ismount(mount)
        assert sorted(os.listdir(mount)) == [cow.LIVE, cow.SNAPSHOTS]  # only the frozen layers are kept
        config = IsolatedSandboxConfig(from_snapshot=str(source))
        children = [IsolatedSandbox(sandbox_spec(task), f"pool-child-{i}", config) for i in range(2)]
        await asyncio.gather(*(child.start() for child in children))
        try:
            first, second = children
            workspace, home = first.layout.workspace, first.layout.home
            for child in children:  # the state at step 3, not the final one; no seed copied over it
                assert await child.get_file(f"{workspace}/state") == b"3\n"
                assert await child.get_file(f"{home}/session") == b"s3\n"
                owner = await child.exec(["stat", "-c", "%U", workspace, home])
                assert owner.stdout.decode().split() == ["agent", "agent"]
                state = Path(f"/proc/{child.init_pid}/root") / workspace.lstrip("/") / "state"
                assert state.stat().st_uid == child.id_base  # the pool's files, re-owned to its range
            assert first.id_base != second.id_base
            await first.exec(["sh", "-c", f"echo first > {workspace}/state && echo x > {home}/mine"])
            assert await second.get_file(f"{workspace}/state") == b"3\n"  # never the other's writes
            assert (await second.exec(["test", "-e", f"{home}/mine"])).exit_code == 1
            frozen = source.frozen / "0" / "state"
            assert frozen.read_bytes() == b"3\n"
            with pytest.raises(OSError):
                frozen.write_bytes(b"host")  # read-only to the kernel, whoever asks
            # A child snapshots and restores on its own, beside the pool's snapshots.
            await second.snapshot("step-3", [workspace])
            await second.exec(["sh", "-c", f"echo later > {workspace}/state"])
            await second.restore("step-3")
            assert await second.get_file(f"{workspace}/state") == b"3\n"
            assert (source.frozen / "0" / "state").read_bytes() == b"3\n"
        finally:
            await asyncio.gather(*(child.stop() for child in children))
        assert not any((mount / storage.CHILDREN).iterdir())  # each child removed its own folder
        report = local_sandbox.prune(IsolatedSandboxConfig())
        assert str(source.pool) not in report.get("disks", [])  # kept within its retention time
    finally:
        disk.remove(source.pool)


async def test_a_start_from_a_missing_snapshot_or_no_pool_fails_and_leaves_nothing(
    task: Task, tmp_path: Path
) -> None:
    source = await record_pool(task, "pool-missing")
    try:
        for text in (f"{source.pool}:step-9", f"{tmp_path}:step-3", "step-3"):
            sandbox = IsolatedSandbox(
                sandbox_spec(task), "pool-bad", IsolatedSandboxConfig(from_snapshot=text)
            )
            with pytest.raises(SandboxError, match="no snapshot"):
                await sandbox.start()
            assert not sandbox.folder.exists()
        removed = local_sandbox.prune(IsolatedSandboxConfig(), "pool-missing")  # never others' disks
        assert str(source.pool) in removed["disks"] and not source.pool.exists()
    finally:
        disk.remove(source.pool)


async def test_pool_snapshot_keeps_the_disk_as_a_pool_unless_keep_snapshots_is_false(task: Task) -> None:
    """`pool_snapshot` (what checkpoints record as ``pool.json``): ``<pool>:<name>`` by default,
    which a child then starts from (the disk kept as a pool); None with ``keep_snapshots`` False.
    A sandbox that took no pool snapshot leaves no disk behind."""
    async with IsolatedSandbox(
        sandbox_spec(task), "pool-off", IsolatedSandboxConfig(keep_snapshots=False)
    ) as off:
        assert await off.pool_snapshot("step-1") is None
    async with IsolatedSandbox(sandbox_spec(task), "pool-unused", IsolatedSandboxConfig()) as unused:
        await unused.snapshot("step-1", [unused.layout.workspace])  # a snapshot, not a pool's
        assert unused._storage is not None
        unused_disk = unused._storage.disk.folder
    assert not unused_disk.exists()
    async with IsolatedSandbox(sandbox_spec(task), "pool-ref", IsolatedSandboxConfig()) as sandbox:
        await sandbox.exec(["sh", "-c", f"echo 1 > {sandbox.layout.workspace}/state"])
        reference = await sandbox.pool_snapshot("step-1")
        await sandbox.exec(["sh", "-c", f"echo final > {sandbox.layout.workspace}/state"])
    assert reference is not None
    source = storage.PoolSnapshot.parse(reference)
    try:
        config = IsolatedSandboxConfig(from_snapshot=reference)
        async with IsolatedSandbox(sandbox_spec(task), "pool-ref-child", config) as child:
            assert await child.get_file(f"{child.layout.workspace}/state") == b"1\n"
    finally:
        disk.remove(source.pool)
