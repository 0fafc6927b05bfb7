"""The shared processes' bookkeeping, in this process (their start replaced by a short wait): a
linger that `acquire` cancelled stops nothing, each name starts under its own lock, and a
prestarted process is found started by the first rollout, then lingers like one left; and, with a
real process, a prestart still starting when its command ends is stopped with the loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from reroll.host import shared_process
from reroll.host.shared_process import PROXY_MODULE, PROXY_NAME, SharedProcess, prestart

START_SECONDS = 0.05


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float, float]]:
    """Processes that "start" in `START_SECONDS` (name, start, end: loop time), stop when asked,
    and linger 0.05 s; the starts made so far."""
    made: list[tuple[str, float, float]] = []
    stopped: set[int] = set()

    async def start(self: SharedProcess) -> None:
        began = asyncio.get_running_loop().time()
        await asyncio.sleep(START_SECONDS)
        made.append((self.name, began, asyncio.get_running_loop().time()))

    async def stop(self: SharedProcess) -> None:
        running = shared_process._RUNNING.get(self.loop, {})
        if running.get(self.name) is self:
            del running[self.name]
        stopped.add(id(self))
        shutil.rmtree(self.workdir, ignore_errors=True)

    monkeypatch.setattr(SharedProcess, "start", start)
    monkeypatch.setattr(SharedProcess, "stop", stop)
    monkeypatch.setattr(SharedProcess, "alive", lambda self: id(self) not in stopped)
    monkeypatch.setattr(shared_process, "LINGER_SECONDS", 0.05)
    monkeypatch.delenv(shared_process.MODE_ENV, raising=False)
    return made


def test_a_linger_cancelled_by_acquire_stops_nothing(starts: list[tuple[str, float, float]]) -> None:
    async def scenario() -> tuple[bool, bool]:
        process = await shared_process.shared_process("m", "proxy")
        process.acquire()
        process.release()  # lingers
        await asyncio.sleep(0.01)  # the linger sleeps now
        process.acquire()  # cancels it ...
        process.release()  # ... and leaves before the cancel lands: a new linger
        await asyncio.sleep(0.02)  # the first linger's cancel landed; the second's not due
        alive_then = process.alive()
        await asyncio.sleep(0.1)
        return alive_then, process.alive()

    alive_then, alive_after = asyncio.run(scenario())
    assert alive_then  # the cancelled linger stopped nothing
    assert not alive_after  # the last one did


def test_two_names_start_at_once_one_name_once(starts: list[tuple[str, float, float]]) -> None:
    async def scenario() -> list[SharedProcess]:
        return list(
            await asyncio.gather(
                shared_process.shared_process("m", "proxy"),
                shared_process.shared_process("m", "scripted-model"),
                shared_process.shared_process("m", "proxy"),
            )
        )

    first, model, again = asyncio.run(scenario())
    assert first is again and first is not model
    assert sorted(name for name, _, _ in starts) == ["proxy", "scripted-model"]
    (_, began_a, ended_a), (_, began_b, ended_b) = starts
    assert began_b < ended_a and began_a < ended_b  # together, not one after the other


def test_a_prestarted_process_is_found_then_lingers(starts: list[tuple[str, float, float]]) -> None:
    async def scenario() -> tuple[bool, bool]:
        prestart("m", "proxy")
        await asyncio.sleep(0)
        process = await shared_process.shared_process("m", "proxy")
        process.acquire()
        await asyncio.sleep(0.1)  # past the prestart's linger: in use, kept
        kept = process.alive()
        process.release()
        await asyncio.sleep(0.1)
        return kept, process.alive()

    kept, alive_after = asyncio.run(scenario())
    assert len(starts) == 1
    assert kept and not alive_after


def test_no_prestart_per_rollout(
    starts: list[tuple[str, float, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shared_process.MODE_ENV, "per-rollout")

    async def scenario() -> None:
        prestart("m", "proxy")
        await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert starts == []


def our_children(command_part: str) -> list[int]:
    """This process's live child processes whose command line has `command_part`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue  # not a process, or gone
        fields = stat.rpartition(")")[2].split()  # state, ppid, ...
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and command_part in command:
            found.append(int(proc.name))
    return found


@pytest.mark.spawns
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_command_ending_while_its_prestart_starts_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(shared_process.MODE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its folder (log, ready file) goes

    async def command() -> list[int]:
        prestart(PROXY_MODULE, PROXY_NAME)
        await asyncio.sleep(0)  # spawned: it imports for a second before it is ready
        raise RuntimeError(our_children(PROXY_MODULE))  # e.g. a bad flag, before any rollout

    with pytest.raises(RuntimeError) as ended:
        asyncio.run(command())
    assert ended.value.args[0], "the prestart spawned no proxy"
    assert our_children(PROXY_MODULE) == []  # stopped with the loop, not left to the controller's exit
    assert list(tmp_path.iterdir()) == []  # and its folder removed
