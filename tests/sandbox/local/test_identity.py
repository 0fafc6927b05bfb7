"""One host identity per isolated local sandbox (issue 32): two running sandboxes have different
host uids, neither can signal or ptrace the other's processes, what each writes is owned by its
own range, and a crashed holder's slot is reclaimed. Before, every sandbox's root was host uid
100000: the same user could signal and read the other's processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll import conformance
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local import identity, rootview
from reroll.sandbox.local.identity import SLOT_COUNT, SLOT_ID_START, IdSlot, shift_tree
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.rootview import AGENT_ID, ID_COUNT, IMAGE_ID_BASE, INSTALLER_ID_BASE
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.sandbox.local.storage import prune_local_disks
from reroll.tasks.task import Task

from tests.sandbox.local.host_ids import as_user, host_pid, uids

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]

HOLD = """
import os, sys
from pathlib import Path
from reroll.sandbox.local.identity import IdSlot
slot = IdSlot.acquire(Path(sys.argv[1]))
print(slot.index, flush=True)
sys.stdin.read()
"""


async def test_two_running_sandboxes_are_two_host_users_that_cannot_touch_each_other(task: Task) -> None:
    spec = sandbox_spec(task)
    async with IsolatedSandbox(spec, "identity-a") as first, IsolatedSandbox(spec, "identity-b") as second:
        assert first.init_pid is not None and second.init_pid is not None
        bases = [first.id_base, second.id_base]
        assert bases[0] != bases[1] and all(base >= SLOT_ID_START for base in bases)
        assert abs(bases[0] - bases[1]) >= ID_COUNT  # ranges, not ids, apart
        for sandbox in (first, second):
            assert sandbox.init_pid is not None
            assert set(uids(sandbox.init_pid)) == {sandbox.id_base}
        agent = await conformance.sh(second, "touch made-by-agent; sleep 300 & echo $!", user="agent")
        victim = host_pid(second.init_pid, int(agent.split()[-1]))
        assert set(uids(victim)) == {second.id_base + AGENT_ID}
        for attacker in (first.id_base, first.id_base + AGENT_ID):  # its root, its agent
            killed = as_user(attacker, "kill", "-0", str(victim))
            assert killed.returncode != 0 and "not permitted" in killed.stderr, killed
            read = as_user(attacker, "cat", f"/proc/{victim}/environ")  # ptrace_may_access
            assert read.returncode != 0 and "Permission denied" in read.stderr, read
        workspace = Path(f"/proc/{second.init_pid}/root") / second.layout.workspace.lstrip("/")
        info = (workspace / "made-by-agent").stat()
        assert (info.st_uid, info.st_gid) == (second.id_base + AGENT_ID,) * 2


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding a slot of ``tmp_path/slots`` (killed at the end)."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "slots")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stdout.readline().strip() == "0"
        yield process
        process.kill()


def test_a_held_slot_is_skipped_and_a_crashed_holders_is_reclaimed(
    holder: subprocess.Popen[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "slots"
    taken = IdSlot.acquire(folder)
    assert taken.index == 1 and taken.base == SLOT_ID_START + ID_COUNT
    taken.release()
    assert (folder / "1").read_text() == ""  # released cleanly
    holder.send_signal(signal.SIGKILL)  # crashes: its lock goes, its pid stays in the file
    holder.wait()
    assert (folder / "0").read_text().strip() == str(holder.pid)
    checked: list[int] = []

    def range_busy(base: int) -> bool:
        checked.append(base)
        return False

    monkeypatch.setattr(identity, "_range_busy", range_busy)
    reclaimed = IdSlot.acquire(folder)
    assert reclaimed.index == 0 and checked == [SLOT_ID_START]  # checked for leftovers, then reused
    reclaimed.release()
    reclaimed.release()


def test_a_crashed_slot_whose_processes_still_run_is_left_alone() -> None:
    """The kernel check behind `IdSlot.acquire`: a process of the range (any of its uids) makes it busy."""
    base = SLOT_ID_START + (SLOT_COUNT - 1) * ID_COUNT
    assert not identity._range_busy(base)
    sleeper = subprocess.Popen(
        ["setpriv", f"--reuid={base + 7}", f"--regid={base + 7}", "--clear-groups", "sleep", "60"]
    )
    try:
        deadline = 200
        while not identity._range_busy(base) and deadline:  # until setpriv has switched
            deadline -= 1
            time.sleep(0.01)
        assert identity._range_busy(base)
        assert not identity._range_busy(base + ID_COUNT)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not identity._range_busy(base)


def test_the_ranges_never_meet_the_installers_or_the_images() -> None:
    assert max(INSTALLER_ID_BASE, IMAGE_ID_BASE) + ID_COUNT <= SLOT_ID_START
    assert SLOT_ID_START + SLOT_COUNT * ID_COUNT < 2**32 - 1


def test_shift_tree_moves_owners_of_the_range_only(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "tool").write_text("x")
    (tmp_path / "dir" / "other").write_text("x")
    (tmp_path / "link").symlink_to("/etc/passwd")
    old, new = SLOT_ID_START, SLOT_ID_START + 3 * ID_COUNT
    os.lchown(tmp_path, old, old)
    os.lchown(tmp_path / "dir", old + AGENT_ID, old + AGENT_ID)
    os.lchown(tmp_path / "dir" / "tool", old, old + 5)
    (tmp_path / "dir" / "tool").chmod(0o4755)
    os.lchown(tmp_path / "dir" / "other", 0, 0)
    os.lchown(tmp_path / "link", old + 1, old + 1)
    shift_tree(tmp_path, old, new)
    owners = {
        name: (os.lstat(tmp_path / name).st_uid, os.lstat(tmp_path / name).st_gid)
        for name in ("", "dir", "dir/tool", "dir/other", "link")
    }
    assert owners == {
        "": (new, new),
        "dir": (new + AGENT_ID,) * 2,
        "dir/tool": (new, new + 5),
        "dir/other": (0, 0),
        "link": (new + 1,) * 2,
    }
    assert (tmp_path / "dir" / "tool").stat().st_mode & 0o7777 == 0o4755  # setuid kept
    assert Path("/etc/passwd").stat().st_uid == 0  # the link was not followed


def test_allocators_at_once_never_share_a_slot(tmp_path: Path) -> None:
    """Six allocating processes and two allocations of this one, all at once: eight slots."""
    folder = tmp_path / "slots"
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    mine: list[IdSlot] = []
    try:
        mine += [IdSlot.acquire(folder), IdSlot.acquire(folder)]  # two lock files, two slots
        indices = [int(holder.stdout.readline()) for holder in holders if holder.stdout is not None]
        indices += [slot.index for slot in mine]
        assert sorted(indices) == list(range(8))
        assert identity.reclaim_slots(folder) == []  # all held: nothing reclaimed, nothing killed
        assert all(holder.poll() is None for holder in holders)
        freed = mine[0].index
        mine[0].release()
        mine[0] = IdSlot.acquire(folder)
        assert mine[0].index == freed  # the only free one: given back, taken again
    finally:
        for slot in mine:
            slot.release()
        for holder in holders:
            holder.kill()
            holder.communicate()


KILLED_CONTROLLER = """
import fcntl, os, subprocess, sys
slot = open(sys.argv[1], "a+")
fcntl.flock(slot, fcntl.LOCK_EX)
slot.write(f"{os.getpid()}\\n")
slot.flush()
uid = sys.argv[2]  # a sandbox's process that outlives its controller (its own session)
subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "setsid", "sleep", "600"])
print("holding", flush=True)
sys.stdin.read()
"""


def test_prune_reclaims_a_killed_controllers_range_and_never_a_held_one(tmp_path: Path) -> None:
    """The last slot (no sandbox of this machine runs there): its controller holds it and leaves a
    process under its range; `reclaim_slots` leaves it while held, kills the process and empties
    the slot once the controller was killed."""
    folder, index = tmp_path / "slots", SLOT_COUNT - 1
    folder.mkdir()
    base = SLOT_ID_START + index * ID_COUNT
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_CONTROLLER, str(folder / str(index)), str(base + 7)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as controller:
        assert controller.stdout is not None and controller.stdout.readline() == "holding\n"
        for _ in range(200):  # until setpriv has switched
            if identity._range_pids(base):
                break
            time.sleep(0.01)
        left = identity._range_pids(base)
        assert len(left) == 1
        assert identity.reclaim_slots(folder) == [] and identity._range_pids(base) == left
        controller.kill()
    assert (folder / str(index)).read_text().strip() == str(controller.pid)
    assert identity._range_busy(base)  # `IdSlot.acquire` would skip it
    assert identity.reclaim_slots(folder) == [f"{base}-{base + ID_COUNT - 1}"]
    assert identity._range_pids(base) == [] and (folder / str(index)).read_text() == ""
    assert identity.reclaim_slots(folder) == []  # released now


CONTROLLER = """
import asyncio, sys
from pathlib import Path
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.tasks.task import load_task

async def main():
    sandbox = IsolatedSandbox(sandbox_spec(load_task(Path(sys.argv[1]))), sys.argv[2])
    await sandbox.start()
    print(sandbox.id_base, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_a_killed_controllers_sandbox_range_is_freed_by_prune(task: Task) -> None:
    """A controller running a real sandbox is killed (SIGKILL): its slot keeps its pid, and
    ``reroll sandbox prune --sandbox local`` frees the range (nothing left running under it) and
    removes the sandbox's disk."""
    run_id = f"killed-{os.getpid()}"
    with subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(task.path), run_id], stdout=subprocess.PIPE, text=True
    ) as controller:
        assert controller.stdout is not None
        base = int(controller.stdout.readline())
        assert identity._range_busy(base)
        controller.kill()
    slot = identity.SLOTS_DIR / str((base - SLOT_ID_START) // ID_COUNT)
    assert slot.read_text().strip() == str(controller.pid)
    report = prune_local_disks(IsolatedSandboxConfig(), run_id)
    assert f"{base}-{base + ID_COUNT - 1}" in report["id ranges"], report
    assert not identity._range_busy(base) and slot.read_text() == ""
    assert [disk for disk in report["disks"] if run_id in disk], report
