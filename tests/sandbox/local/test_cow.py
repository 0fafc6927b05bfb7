"""Copy-on-write snapshots of the isolated local sandbox (`reroll.sandbox.local.cow`), on a real
loop-mounted btrfs: frozen snapshots are never writable, each restore is a writable layer of its
own, what is not a subvolume takes the tar path, and a restore never follows a planted link."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.docker.disk import SizedDisk
from reroll.sandbox.local import cow, rootview
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.tasks.task import Task
from reroll_contracts.errors import SandboxError

from tests.conftest import NEEDS_BTRFS

pytestmark = NEEDS_BTRFS


def used_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def test_a_snapshot_is_read_only_even_to_the_host_and_holds_only_the_bytes_changed(
    btrfs_disk: SizedDisk,
) -> None:
    disk = btrfs_disk
    subvolumes = cow.Subvolumes.create(disk.mountpoint, {"/app": disk.mountpoint / "app"})
    (disk.mountpoint / "app" / "big").write_bytes(os.urandom(8 << 20))
    os.sync()
    before = used_bytes(disk.mountpoint)
    assert subvolumes.snapshot("first", ["/app"]) >= 8 << 20
    os.sync()
    assert used_bytes(disk.mountpoint) - before < 2 << 20  # shares the 8 MiB, copies nothing
    frozen = disk.mountpoint / cow.SNAPSHOTS / "first" / "0"
    with pytest.raises(OSError) as raised:
        (frozen / "big").write_bytes(b"changed")
    assert raised.value.errno == errno.EROFS
    with pytest.raises(OSError):
        (frozen / "new").write_bytes(b"x")
    assert subvolumes.has("first") and not subvolumes.has("second")
    subvolumes.forget("first")
    assert not subvolumes.has("first") and not frozen.exists()
    with pytest.raises(SandboxError, match="snapshot name"):
        subvolumes.snapshot("../escape", ["/app"])


async def test_each_restore_is_a_fresh_writable_layer_over_the_frozen_one(task: Task) -> None:
    if rootview.namespaces_unavailable():
        pytest.skip("this machine forbids namespaces")
    async with IsolatedSandbox(sandbox_spec(task), "cow-restore") as sandbox:
        workspace, home = sandbox.layout.workspace, sandbox.layout.home
        sh = ["sh", "-c"]
        await sandbox.exec(
            [*sh, f"echo one > {workspace}/f && echo h > {home}/h && ln {workspace}/f {workspace}/g"]
        )
        assert await sandbox.snapshot("step", [workspace, home]) > 0
        await sandbox.exec([*sh, f"echo two > {workspace}/f && rm {home}/h && echo new > {workspace}/new"])
        assert await sandbox.restore("step") == [workspace, home]
        listing = await sandbox.exec(
            [*sh, f"cat {workspace}/f {home}/h; ls {workspace}; stat -c %h {workspace}/g"]
        )
        words = listing.stdout.decode().split()
        assert words[:2] == ["one", "h"] and words[-1] == "2" and "new" not in words
        await sandbox.exec([*sh, f"echo child-one > {workspace}/f"])  # the first child's write
        await sandbox.restore("step")
        assert (await sandbox.get_file(f"{workspace}/f")) == b"one\n"  # the second never sees it
        frozen = sandbox._storage.disk.mountpoint / cow.SNAPSHOTS / "step" / "0"  # type: ignore[union-attr]
        assert (frozen / "f").read_bytes() == b"one\n"
        # The sandbox's root cannot take the restore away (no CAP_SYS_ADMIN), nor reach the frozen layers.
        escape = await sandbox.exec(
            [*sh, f"umount {workspace} || umount -l {workspace}; ls / | grep -c snapshots"]
        )
        assert escape.exit_code != 0 and escape.stdout.decode().strip() == "0"
        assert (await sandbox.get_file(f"{workspace}/f")) == b"one\n"
        mounts = (await sandbox.exec(["cat", "/proc/self/mountinfo"])).stdout.decode()
        assert (
            sum(f" {workspace} " in line for line in mounts.splitlines()) == 2
        )  # the original and one restore


async def test_other_paths_and_a_disk_without_copy_on_write_take_the_tar_path(task: Task) -> None:
    if rootview.namespaces_unavailable():
        pytest.skip("this machine forbids namespaces")
    async with IsolatedSandbox(sandbox_spec(task), "cow-tar") as sandbox:
        workspace = sandbox.layout.workspace
        await sandbox.put_file(f"{workspace}/keep", b"kept")
        await sandbox.snapshot("named", [f"{workspace}/keep"])
        subvolumes = sandbox._storage.cow  # type: ignore[union-attr]
        assert subvolumes is not None and not subvolumes.has("named")
        await sandbox.put_file(f"{workspace}/keep", b"changed")
        assert await sandbox.restore("named") == [f"{workspace}/keep"]
        assert await sandbox.get_file(f"{workspace}/keep") == b"kept"
        await sandbox.snapshot("both")
        assert subvolumes.has("both")
        await sandbox.snapshot("both", [f"{workspace}/keep"])  # a tar snapshot replaces it
        assert not subvolumes.has("both")
    config = IsolatedSandboxConfig(copy_on_write=False)
    async with IsolatedSandbox(sandbox_spec(task), "cow-off", config) as sandbox:
        kind = await sandbox.exec(["stat", "-f", "-c", "%T", sandbox.layout.workspace])
        assert kind.stdout.decode().strip() == "ext2/ext3" and sandbox._storage.cow is None  # type: ignore[union-attr]


async def test_a_restore_follows_no_link_planted_on_the_workspaces_path(task: Task) -> None:
    """The attack: the sandbox's root moves the workspace's parent away and puts a relative link
    in its place, so that a restore resolving the path would mount the snapshot on its decoy."""
    if rootview.namespaces_unavailable():
        pytest.skip("this machine forbids namespaces")
    spec = dataclasses.replace(sandbox_spec(task), workdir="/srv/work")
    async with IsolatedSandbox(spec, "cow-link") as sandbox:
        assert sandbox.layout.workspace == "/srv/work"
        await sandbox.put_file("/srv/work/f", b"snapshotted")
        await sandbox.snapshot("before")
        plant = "mv /srv /srv.moved && mkdir -p /decoy/work && echo decoy > /decoy/work/f && ln -s decoy /srv"
        planted = await sandbox.exec(["sh", "-c", plant])
        assert planted.exit_code == 0, planted.output_text()
        with pytest.raises(SandboxError, match="restore"):
            await sandbox.restore("before")
        assert await sandbox.get_file("/decoy/work/f") == b"decoy\n"
