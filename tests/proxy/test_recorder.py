"""Recorder: one durable line per exchange, in step order whatever order the steps finish in."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from reroll_proxy.exchange import Exchange, load_trajectory
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
    recorder.close()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0, 2, 3]
    assert path.read_bytes().count(b"\n") == 3


async def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(exchange(7).to_line())
    recorder = Recorder(path)
    await recorder.record(0, exchange(0))
    recorder.close()
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [7, 0]


@pytest.mark.parametrize("fsync", [True, False])
async def test_fsync_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    path = tmp_path / "t.jsonl"
    recorder = Recorder(path, fsync=fsync)
    recorder.open()
    synced.clear()  # the folder's entry is synced on open either way
    await recorder.record(0, exchange(0))
    recorder.close()
    assert len(synced) == (1 if fsync else 0)
    assert [e.metadata.step for e in load_trajectory(path).exchanges] == [0]
