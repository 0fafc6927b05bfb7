"""One host identity per isolated local sandbox (issue 32): two running sandboxes have different
host uids, neither can signal or ptrace the other's processes, what each writes is owned by its
own range, and a crashed holder's slot is reclaimed. Before, every sandbox's root was host uid
100000: the same user could signal and read the other's processes."""

from __future__ import annotations

import contextlib
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
from reroll.tasks.task import Task

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


def _uids(pid: int) -> list[int]:
    """The real, effective, saved and file system uids of host process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return [int(value) for value in next(line for line in status if line.startswith("Uid:")).split()[1:]]


def _as_user(uid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` on the host as `uid` (and gid), no supplementary groups."""
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


async def test_two_running_sandboxes_are_two_host_users_that_cannot_touch_each_other(task: Task) -> None:
    spec = sandbox_spec(task)
    async with IsolatedSandbox(spec, "identity-a") as first, IsolatedSandbox(spec, "identity-b") as second:
        assert first.init_pid is not None and second.init_pid is not None
        bases = [first.id_base, second.id_base]
        assert bases[0] != bases[1] and all(base >= SLOT_ID_START for base in bases)
        assert abs(bases[0] - bases[1]) >= ID_COUNT  # ranges, not ids, apart
        for sandbox in (first, second):
            assert set(_uids(sandbox.init_pid)) == {sandbox.id_base}
        agent = await conformance.sh(second, "touch made-by-agent; sleep 300 & echo $!", user="agent")
        victim = _host_pid(second.init_pid, int(agent.split()[-1]))
        assert set(_uids(victim)) == {second.id_base + AGENT_ID}
        for attacker in (first.id_base, first.id_base + AGENT_ID):  # its root, its agent
            killed = _as_user(attacker, "kill", "-0", str(victim))
            assert killed.returncode != 0 and "not permitted" in killed.stderr, killed
            read = _as_user(attacker, "cat", f"/proc/{victim}/environ")  # ptrace_may_access
            assert read.returncode != 0 and "Permission denied" in read.stderr, read
        workspace = Path(f"/proc/{second.init_pid}/root") / second.layout.workspace.lstrip("/")
        info = (workspace / "made-by-agent").stat()
        assert (info.st_uid, info.st_gid) == (second.id_base + AGENT_ID,) * 2


def _host_pid(init_pid: int, inner: int) -> int:
    """The host pid of the process `inner` of the PID namespace whose init is `init_pid`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "ns/pid") != os.readlink(f"/proc/{init_pid}/ns/pid"):
                continue
            ns_pids = next(
                line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid")
            )
            if int(ns_pids.split()[-1]) == inner:
                return int(entry.name)
    raise AssertionError(f"no process {inner} in the sandbox")


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
    monkeypatch.setattr(identity, "_range_busy", lambda base: checked.append(base) or False)
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
