"""Recorder: one durable line per exchange, in step order whatever order the steps finish in."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from reroll_contracts.trajectory import Exchange, load_trajectory
from reroll_proxy.recorder import Recorder


def exchange(step: int) -> Exchange:
    return Exchange.model_validate(
        {
            "request": {"timestamp": "t", "path": "/v1/chat/completions", "body": {"messages": []}},
            "response": {"timestamp": "t", "status_code": 200, "body": {"step": step}},
            "metadata": {"step": step},
        }
    )


async def test_lines_are_appended_in_step_order(tmp_path: Path) -> None:
    path = tmp_path / "run" / "trajectory" / "llm_trajectory.jsonl"
    recorder = Recorder(path)
    recorder.open()
    later = asyncio.create_task(recorder.record(2, exchange(2)))
    skipped = asyncio.create_task(recorder.skip(1))
    await asyncio.sleep(0.05)
    assert not later.done() and path.read_bytes() == b""
    await recorder.record(0, exchange(0))
    await asyncio.wait_for(asyncio.gather(later, skipped), 5)
    await recorder.skip(0)
    await recorder.record(3, exchange(3))
    await recorder.aclose()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0, 2, 3]
    assert path.read_bytes().count(b"\n") == 3


async def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(exchange(7).to_line())
    recorder = Recorder(path)
    await recorder.record(0, exchange(0))
    await recorder.aclose()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [7, 0]


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The file descriptors fsynced from now on (each fsync still done)."""
    calls: list[int] = []
    real_fsync = os.fsync

    def recorded_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    return calls


@pytest.mark.parametrize("fsync", [True, False])
async def test_fsync_can_be_turned_off(tmp_path: Path, synced: list[int], fsync: bool) -> None:
    path = tmp_path / "t.jsonl"
    recorder = Recorder(path, fsync=fsync)
    recorder.open()
    synced.clear()  # the folder's entry is synced on open either way
    await recorder.record(0, exchange(0))
    await recorder.aclose()
    assert len(synced) == (1 if fsync else 0)
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0]


async def test_fsync_overlaps_the_response_but_precedes_the_next_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`record` returns once the line is in the OS; the next line waits for the previous fsync."""
    path = tmp_path / "t.jsonl"
    recorder = Recorder(path)
    recorder.open()
    release = threading.Event()
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: release.wait(10) and real_fsync(fd))
    await asyncio.wait_for(recorder.record(0, exchange(0)), 5)
    assert path.read_bytes() == exchange(0).to_line()  # a killed proxy loses nothing
    second = asyncio.create_task(recorder.record(1, exchange(1)))
    await asyncio.sleep(0.1)
    assert not second.done() and path.read_bytes().count(b"\n") == 1
    release.set()
    await asyncio.wait_for(second, 5)
    await recorder.aclose()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0, 1]


async def test_a_failed_fsync_is_raised_by_the_next_record_and_by_aclose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    path = tmp_path / "t.jsonl"
    recorder = Recorder(path)
    recorder.open()
    monkeypatch.setattr(os, "fsync", failing_fsync)
    await recorder.record(0, exchange(0))
    with pytest.raises(OSError, match="Input/output error"):
        await recorder.record(1, exchange(1))
    await recorder.record(1, exchange(1))  # the error is reported once
    with pytest.raises(OSError, match="Input/output error"):
        await recorder.aclose()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0, 1]


async def test_the_fsync_thread_ends_with_aclose_and_a_reopened_recorder_syncs_again(
    tmp_path: Path, synced: list[int]
) -> None:
    path = tmp_path / "t.jsonl"
    recorder = Recorder(path)
    before = set(threading.enumerate())  # another test's recorder may still have its thread
    for step in range(2):  # closed after each: the second record reopens the file
        recorder.open()
        synced.clear()  # the folder's entry is synced on open
        await recorder.record(step, exchange(step))
        ours = [t for t in threading.enumerate() if t.name == "reroll-fsync" and t not in before]
        await recorder.aclose()
        assert len(synced) == 1 and len(ours) == 1
        ours[0].join(5)
        assert not ours[0].is_alive()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0, 1]
