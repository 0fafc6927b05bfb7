"""The local sandbox's cgroups (`reroll.sandbox.local.cgroups`): which hierarchy is used, what is
written where (v2 on a fake cgroup root, v1 on fake hierarchies), how hits are read back; and,
where this machine allows it, a real group holding a real process tree that dies with it."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from reroll.sandbox.local import cgroups
from reroll.sandbox.local.cgroups import CgroupError, CgroupLayout, SandboxCgroup, SandboxLimits
from reroll.sandbox.spec import ResourceLimits

# This machine's /proc/self/mountinfo (a "hybrid" layout: the v1 hierarchies hold the
# controllers, the cgroup2 mount has none of ours), and a systemd machine's (v2 only).
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PARENT = cgroups.PARENT
LIMITS = SandboxLimits.of(ResourceLimits(memory_mb=1024, cpus=0.5, pids_max=100, storage_mb=512))


def unified(root: Path) -> str:
    """A mountinfo text with only a cgroup2 mount, at `root`."""
    return f"25 1 0:22 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def fake_v2_root(root: Path, controllers: str = "cpuset cpu io memory hugetlb pids") -> Path:
    """The files of a cgroup2 root, and of ``reroll`` below it, that exist before `create`."""
    (root / PARENT).mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("memory\n")
    (root / PARENT / "cgroup.subtree_control").write_text("")
    return root


def test_parse_mountinfo_finds_every_hierarchy() -> None:
    v1, v2 = cgroups.parse_mountinfo(HYBRID)
    assert v1 == {
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct"),
        "memory": Path("/sys/fs/cgroup/memory"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }
    assert v2 == Path("/sys/fs/cgroup/unified")


def test_a_hybrid_machine_uses_v1_and_paths_are_per_hierarchy() -> None:
    layout = cgroups.detect(HYBRID)  # the unified mount does not exist here: no memory controller
    assert layout.version == 1
    assert layout.group_paths("reroll-local-x") == {
        "memory": Path("/sys/fs/cgroup/memory/reroll/reroll-local-x"),
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/reroll/reroll-local-x"),
        "pids": Path("/sys/fs/cgroup/pids/reroll/reroll-local-x"),
    }


def test_a_unified_root_with_the_memory_controller_uses_v2(tmp_path: Path) -> None:
    layout = cgroups.detect(unified(fake_v2_root(tmp_path)))
    assert layout == CgroupLayout(2, {"": tmp_path})
    assert layout.group_paths("g") == {"": tmp_path / "reroll" / "g"}


def test_missing_controllers_are_named(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="lacks the controllers pids"):
        cgroups.detect(unified(fake_v2_root(tmp_path, "cpu memory")))
    without_pids = "\n".join(line for line in HYBRID.splitlines() if "pids" not in line)
    with pytest.raises(CgroupError, match="no cgroup v1 hierarchy holds the controllers pids"):
        cgroups.detect(without_pids)
    with pytest.raises(CgroupError, match="no cgroup hierarchy with the memory controller"):
        cgroups.detect("22 1 0:5 / /proc rw - proc proc rw\n")


def test_limits_size_the_shm_tmpfs_below_the_memory_limit() -> None:
    assert (LIMITS.memory_bytes, LIMITS.cpus, LIMITS.pids_max, LIMITS.storage_mb) == (1 << 30, 0.5, 100, 512)
    assert LIMITS.shm_bytes == 64 << 20
    small = SandboxLimits.of(ResourceLimits(memory_mb=128))
    assert small.shm_bytes == 32 << 20  # a quarter of memory_mb


def test_v2_create_enables_the_controllers_and_writes_the_limits(tmp_path: Path) -> None:
    root = fake_v2_root(tmp_path)
    group = SandboxCgroup.create("sandbox-1", LIMITS, cgroups.detect(unified(root)))
    folder = root / "reroll" / "sandbox-1"
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +pids"  # memory was on already
    assert (root / "reroll" / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (folder / "memory.max").read_text() == str(1 << 30)
    assert (folder / "cpu.max").read_text() == "50000 100000"
    assert (folder / "pids.max").read_text() == "100"
    assert group.procs_files == [folder / "cgroup.procs"]
    assert group.enter_command(["unshare", "--fork"]) == [
        "sh",
        "-c",
        cgroups.ENTER_SCRIPT,
        "reroll-cgroup-enter",
        str(folder / "cgroup.procs"),
        "--",
        "unshare",
        "--fork",
    ]
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    (folder / "pids.events").write_text("max 7\n")
    assert group.limits_hit() == [
        "out of memory: the kernel killed 2 process(es) at the sandbox's limit of 1024 MiB "
        "(the task's environment.memory_mb)",
        "out of processes: 7 fork(s) refused at the sandbox's limit of 100 processes and threads "
        "(the task's environment.pids_max)",
    ]


def test_v1_create_writes_each_hierarchy(tmp_path: Path) -> None:
    mounts = {name: tmp_path / name for name in ("memory", "cpu", "pids")}
    for mount in mounts.values():
        mount.mkdir()
    group = SandboxCgroup.create("g", LIMITS, CgroupLayout(1, mounts))
    assert (tmp_path / "memory/reroll/g/memory.limit_in_bytes").read_text() == str(1 << 30)
    assert not (tmp_path / "memory/reroll/g/memory.memsw.limit_in_bytes").exists()  # no swap accounting
    assert (tmp_path / "cpu/reroll/g/cpu.cfs_quota_us").read_text() == "50000"
    assert (tmp_path / "cpu/reroll/g/cpu.cfs_period_us").read_text() == "100000"
    assert (tmp_path / "pids/reroll/g/pids.max").read_text() == "100"
    assert len(group.procs_files) == 3
    assert group.limits_hit() == []  # no events files: nothing hit
    (tmp_path / "memory/reroll/g/memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
    )
    assert group.oom_kills() == 1


def test_a_failure_names_the_file_and_leaves_no_group(tmp_path: Path) -> None:
    root = fake_v2_root(tmp_path)
    (root / "reroll" / "cgroup.subtree_control").unlink()
    (root / "reroll" / "cgroup.subtree_control").mkdir()  # reading it fails: EISDIR
    with pytest.raises(CgroupError, match=r"cgroup g: .*Is a directory: .*reroll/cgroup.subtree_control"):
        SandboxCgroup.create("g", LIMITS, cgroups.detect(unified(root)))
    assert not (root / "reroll" / "g").exists()


def test_full_filesystems_names_the_full_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    real_statvfs = os.statvfs

    def statvfs(path: str | Path) -> os.statvfs_result:
        if Path(path) == tmp_path / "tmp":  # 768 MiB, 4 KiB free
            return os.statvfs_result((4096, 4096, 196608, 1, 1, 0, 0, 0, 0, 255))
        return real_statvfs(path)

    monkeypatch.setattr(os, "statvfs", statvfs)
    mounts = {"/tmp": "the writable layer", "/dev/shm": "64 MiB", "/missing": "gone"}
    assert cgroups.full_filesystems(tmp_path, mounts) == ["out of storage: /tmp is full (the writable layer)"]


def _real_layout() -> CgroupLayout | None:
    if os.geteuid() != 0:
        return None
    try:
        return cgroups.detect()
    except CgroupError:
        return None


@pytest.mark.spawns
@pytest.mark.skipif(_real_layout() is None, reason="no cgroup can be made here (not root, or no hierarchy)")
def test_a_real_group_holds_its_process_tree_from_the_start_and_kills_it_when_removed() -> None:
    group = SandboxCgroup.create(f"reroll-test-{os.getpid()}", LIMITS)
    try:
        argv = group.enter_command(["sh", "-c", "sleep 60 & exec sleep 61"])
        process = subprocess.Popen(argv)
        deadline = time.monotonic() + 10
        while len(group.pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.pid in group.pids() and len(group.pids()) == 2  # the shell's pid, and its child
        assert group.limits_hit() == []
    finally:
        group.remove()
    assert process.wait(timeout=10) == -9
    assert not any(path.exists() for path in group.paths.values())
