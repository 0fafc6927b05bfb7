"""Quiesce through a real sidecar: survivors that hop pids, change sessions and double-fork die.

Each survivor is a seeded variant (fork interval, ``setsid`` or not): it double-forks out of its
Exec process group, then forks every few milliseconds and lets its parent exit, so its pid keeps
changing, and writes each new pid to a heartbeat file (a scan of /proc can miss a process that
hops this fast: the heartbeat cannot). After Kill the heartbeat must stand still.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.sandbox.sidecar_client import SidecarClient
from reroll_sidecar import quiesce

pytestmark = pytest.mark.spawns

SURVIVOR = r"""
import os, random, sys, time
seed, interval, use_setsid, heartbeat = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
random.seed(seed)
if os.fork():
    os._exit(0)  # double fork: out of the Exec child's reach
if use_setsid:
    os.setsid()
print("escaped", flush=True)
os.close(1)  # Exec ends now, not after its grace period for pipes held open
while True:
    time.sleep(interval * random.random())
    if os.fork():
        os._exit(0)  # hop: the child lives on, with a new pid
    if use_setsid and random.random() < 0.5:
        os.setsid()
    with open(heartbeat, "w") as beat:
        beat.write(str(os.getpid()))
"""


async def beating(heartbeat: Path, seconds: float = 1.0) -> bool:
    """Whether the heartbeat file changes within `seconds` (polled)."""
    before = heartbeat.read_text() if heartbeat.exists() else ""
    for _ in range(int(seconds / 0.05)):
        await asyncio.sleep(0.05)
        if heartbeat.exists() and heartbeat.read_text() != before:
            return True
    return False


@pytest.mark.parametrize(
    ("seed", "interval_seconds", "use_setsid"),
    [(1, 0.0, False), (2, 0.005, True), (3, 0.0, True)],
    ids=["fork-storm", "hop-5ms-setsid", "fork-storm-setsid"],
)
async def test_kill_leaves_no_survivor(
    client: SidecarClient, tmp_path: Path, seed: int, interval_seconds: float, use_setsid: bool
) -> None:
    script, heartbeat = tmp_path / "survivor.py", tmp_path / "heartbeat"
    script.write_text(SURVIVOR)
    argv = [sys.executable, str(script), str(seed), str(interval_seconds), "1" if use_setsid else "0"]
    result = await client.exec([*argv, str(heartbeat)], timeout_seconds=30)
    assert result.stdout == b"escaped\n"
    assert await beating(heartbeat), "the survivor did not outlive its Exec"
    await client.kill()
    assert not await beating(heartbeat), "a survivor outlived Kill"


def test_descent_is_by_session_not_terminal() -> None:
    """The walk spares the caller's own session (its helpers) and takes every other one.

    Regression: the session was read from the wrong /proc/PID/stat field (tty_nr), so under a
    caller whose session id is 0 (CI's, started by the VM's init) every descendant looked like a
    helper and none was frozen.
    """
    helper = subprocess.Popen(["sleep", "30"])
    agent = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert quiesce._stat(os.getpid()) == ("R", os.getppid(), os.getsid(0))
        assert quiesce._stat(agent.pid)[2] == agent.pid  # type: ignore[index]
        assert agent.pid in quiesce._live_descendants()
        assert helper.pid not in quiesce._live_descendants()
    finally:
        for process in (helper, agent):
            process.kill()
            process.wait()
