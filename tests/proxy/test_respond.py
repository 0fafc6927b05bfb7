"""Replayed streams: how `EventSource` batches and paces recorded events (in-process, no clock)."""

from __future__ import annotations

import asyncio

import pytest
from reroll_contracts.trajectory import SseEvent
from reroll_proxy.respond import EventSource

EVENTS = [SseEvent(data=str(i)) for i in range(3)]
OFFSETS_MS = [0.0, 200.0, 600.0]


async def served(source: EventSource, monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[str]], list[float]]:
    """The batches `source` yields (their events' data) and the pauses it asked for, in seconds."""
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    batches = [[event.data for event in batch] async for batch in source.batches()]
    return batches, pauses


async def test_timing_factor_zero_sends_every_event_in_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS, timing_factor=0.0), monkeypatch)
    assert batches == [["0", "1", "2"]] and pauses == []


async def test_a_timing_factor_paces_each_event_by_the_recorded_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS, timing_factor=0.5), monkeypatch)
    assert batches == [["0"], ["1"], ["2"]]
    assert pauses == pytest.approx([0.1, 0.2])  # (200 - 0) x 0.5 ms, then (600 - 200) x 0.5 ms


async def test_offsets_of_another_length_send_without_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS[:2], timing_factor=1.0), monkeypatch)
    assert batches == [["0", "1", "2"]] and pauses == []
