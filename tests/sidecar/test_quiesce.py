"""Quiesce through a real sidecar: survivors that hop pids, change sessions and double-fork die;
a task's service (Exec with ``service``) and what it forked outlive the verify's hardening, while
the agent's processes that pass for it (same command line, a forged pid file and variable, an
attempt to join its process group) die.

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
import threading
from pathlib import Path

import pytest
from reroll.sandbox.sidecar_client import SidecarClient
from reroll_contracts.errors import SidecarError
from reroll_sidecar import quiesce

from tests.sidecar.test_sidecar import verify_script

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


SERVICE = r"""
import os, sys, time
beat = os.environ["BEAT"]
with open(os.environ["PID_FILE"], "w") as pid_file:
    pid_file.write(str(os.getpid()))
if os.fork() == 0:  # what the service forks is the service's, even in a session of its own
    os.setsid()
    beat += ".child"
while True:
    with open(beat, "w") as handle:
        handle.write(str(time.monotonic()))
    time.sleep(0.02)
"""

IMPOSTOR = r"""
import os, sys
service, script, tried = int(open(sys.argv[1]).read()), sys.argv[2], sys.argv[3]
try:
    os.setpgid(0, service)  # into the service's process group (another session: refused)
    outcome = "joined"
except PermissionError:
    outcome = "EPERM"
open(tried, "w").write(outcome)
if os.fork():
    os._exit(0)  # double fork, out of the Exec's group
os.setsid()
open(sys.argv[1], "w").write(str(os.getpid()))  # the pid file now names the impostor
os.close(1)
# the service's very command line, with a variable claiming to be one
os.execve(sys.executable, [sys.executable, script], {**os.environ, "REROLL_SERVICE": "1"})
"""


@pytest.mark.parametrize("through", ["verify", "kill"])
async def test_the_agents_quiesce_spares_a_service_and_kills_the_agents_impostors(
    client: SidecarClient, tmp_path: Path, through: str
) -> None:
    """Through the verify's hardening, or the agent's quiesce (Kill with ``spare_services``)."""
    script, impostor = tmp_path / "service.py", tmp_path / "impostor.py"
    script.write_text(SERVICE)
    impostor.write_text(IMPOSTOR)
    pid_file, service_beat, agent_beat = (
        tmp_path / "service.pid",
        tmp_path / "service.beat",
        tmp_path / "agent.beat",
    )
    env = {"PATH": os.environ["PATH"], "PID_FILE": str(pid_file)}
    service = asyncio.create_task(
        client.exec([sys.executable, str(script)], env=env | {"BEAT": str(service_beat)}, service=True)
    )
    try:
        assert await beating(service_beat, 10), "the service did not start"
        tried = tmp_path / "tried"
        agent = [sys.executable, str(impostor), str(pid_file), str(script), str(tried)]
        result = await client.exec(agent, env=env | {"BEAT": str(agent_beat)}, timeout_seconds=30)
        assert result.exit_code == 0, result.stderr
        assert tried.read_text() == "EPERM"  # no process joins a group of another session
        assert await beating(agent_beat) and await beating(Path(f"{agent_beat}.child"))
        # The test script sees the service live (its heartbeat moves while the script runs).
        beat = service_beat
        check = f'a=$(cat {beat}); sleep 0.3; [ "$(cat {beat})" != "$a" ] && echo 1 > $LOGS/reward.txt\n'
        if through == "verify":
            outcome = await verify_script(client, tmp_path / "sandbox", check)
            assert outcome.rewards == {"reward": 1.0}, outcome.output_text()
        else:
            await client.kill(spare_services=True)
        assert await beating(service_beat) and await beating(Path(f"{service_beat}.child"))
        assert not await beating(agent_beat), "the agent's impostor outlived the hardening"
        assert not await beating(Path(f"{agent_beat}.child"))
        assert not service.done()
    finally:
        await client.kill()  # every user: the service too
    assert (await asyncio.wait_for(service, 10)).exit_code == -9
    assert not await beating(service_beat)


async def test_a_service_as_another_user_is_refused_naming_it(client: SidecarClient) -> None:
    """A service runs as the sidecar's own user only (never the agent's, whose quiesce kills by user)."""
    with pytest.raises(
        SidecarError, match=r"INVALID_ARGUMENT.*a service runs as the sidecar's user .*'nobody'"
    ):
        await client.exec(["true"], user="nobody", service=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_user_is_killed_even_when_no_thread_can_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent that used up the sandbox's pids leaves the sidecar unable to start the helper
    thread that signals as the agent's user: the quiesce then signals each of its processes by pid."""
    uid = 101999
    victims = [
        subprocess.Popen(["sleep", "60"], user=uid, group=uid, start_new_session=True) for _ in range(3)
    ]

    def no_thread(self: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    keep = {victim.pid for victim in victims}  # reaped by their waits below, not by the quiesce
    try:
        quiesce.quiesce(quiesce.Selection(uid=uid, descendants=False), keep_reaped=keep, timeout_seconds=10)
        assert [victim.wait(timeout=10) for victim in victims] == [-9, -9, -9]
    finally:
        for victim in victims:
            victim.kill()


BEAT = """import sys, time
while True:
    open(sys.argv[1], "w").write(str(time.monotonic()))
    time.sleep(0.01)
"""


async def test_freeze_stops_what_it_picks_and_thaw_lets_the_same_processes_go_on(tmp_path: Path) -> None:
    """The verify that keeps the agent's processes (Harbor's semantics) freezes them during the
    hardening and lets them go on for the test script."""
    heartbeat = tmp_path / "beat"
    child = subprocess.Popen([sys.executable, "-c", BEAT, str(heartbeat)], start_new_session=True)
    try:
        assert await beating(heartbeat, 10), "the child did not start"
        frozen = quiesce.freeze(quiesce.Selection(uid=None))
        assert quiesce.identity(child.pid) in frozen.descendants
        assert not await beating(heartbeat), "a frozen process went on"
        quiesce.thaw(frozen)
        assert await beating(heartbeat), "thaw did not let it go on"
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("keep", [True, False])
async def test_a_verify_that_keeps_the_agents_processes_runs_its_script_beside_them(
    client: SidecarClient, tmp_path: Path, keep: bool
) -> None:
    """Harbor keeps what the solution left running (a server the tests talk to) for the verifier;
    after the script it dies as always. Without `keep`, the hardening kills it first."""
    script, heartbeat = tmp_path / "survivor.py", tmp_path / "heartbeat"
    script.write_text(SURVIVOR)
    result = await client.exec([sys.executable, str(script), "4", "0.02", "1", str(heartbeat)])
    assert result.stdout == b"escaped\n"
    assert await beating(heartbeat), "the lingering process did not start"
    check = (
        f'a=$(cat {heartbeat}); sleep 0.3; [ "$(cat {heartbeat})" != "$a" ] && echo 1 > $LOGS/reward.txt\n'
        "[ -f $LOGS/reward.txt ] || echo 0 > $LOGS/reward.txt\n"
    )
    outcome = await verify_script(client, tmp_path / "sandbox", check, keep_agent_processes=keep)
    assert outcome.rewards == {"reward": 1.0 if keep else 0.0}, outcome.output_text()
    assert any("kept for the test script" in note for note in outcome.hardening.notes) is keep
    assert not await beating(heartbeat), "the lingering process outlived the verify"
