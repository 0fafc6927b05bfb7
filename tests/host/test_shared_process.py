"""The shared processes' bookkeeping, in this process (their start replaced by a short wait): a
linger that `acquire` cancelled stops nothing, each name starts under its own lock, and a
prestarted process is found started by the first rollout, then lingers like one left."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from reroll.host import shared_process
from reroll.host.shared_process import SharedProcess, prestart

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
