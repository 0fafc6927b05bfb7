"""Host-side settings and locks (`reroll.cache`): the bounded slots of concurrent image builds."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reroll.cache import build_timeout_multiplier, cache_slot, image_builds
from reroll_contracts.errors import ConfigError


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_image_builds_reads_reroll_image_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REROLL_IMAGE_BUILDS", raising=False)
    assert image_builds() == 2
    monkeypatch.setenv("REROLL_IMAGE_BUILDS", " 5 ")
    assert image_builds() == 5
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("REROLL_IMAGE_BUILDS", bad)
        with pytest.raises(ConfigError, match=f"REROLL_IMAGE_BUILDS={bad}: .*a whole number of at least 1"):
            image_builds()


def test_the_build_timeout_multiplier_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Harbor's --environment-build-timeout-multiplier as a host setting: a busy host's builds get
    more than the task's build_timeout_sec."""
    monkeypatch.delenv("REROLL_BUILD_TIMEOUT_MULTIPLIER", raising=False)
    assert build_timeout_multiplier() == 1.0
    monkeypatch.setenv("REROLL_BUILD_TIMEOUT_MULTIPLIER", " 2.5 ")
    assert build_timeout_multiplier() == 2.5
    for bad in ("0", "-1", "two", "inf", "nan"):
        monkeypatch.setenv("REROLL_BUILD_TIMEOUT_MULTIPLIER", bad)
        with pytest.raises(ConfigError, match=f"REROLL_BUILD_TIMEOUT_MULTIPLIER={bad}: .*greater than 0"):
            build_timeout_multiplier()


@pytest.mark.parametrize("slots", [1, 3])
def test_at_most_k_of_n_workers_hold_a_slot_at_once_and_k_do(slots: int) -> None:
    """8 threads take one of `slots` slots each, hold it 0.1 s: never more than `slots` at once,
    and `slots` at once at some point (the slots are not one lock)."""
    holding, most = 0, 0
    taken: list[int] = []
    count = threading.Lock()

    def worker() -> None:
        nonlocal holding, most
        with cache_slot("images/builds", slots, poll_seconds=0.01) as slot:
            with count:
                holding += 1
                most = max(most, holding)
                taken.append(slot)
            time.sleep(0.1)
            with count:
                holding -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(taken) == 8 and most == slots
    assert set(taken) == set(range(slots))


WORKER = """
import sys, time
from reroll.cache import cache_slot
with cache_slot("images/builds", 2, poll_seconds=0.01) as slot:
    print(f"in {time.monotonic()}", flush=True)
    time.sleep(0.3)
    print(f"out {time.monotonic()}", flush=True)
"""


@pytest.mark.spawns
def test_the_slots_bound_separate_processes() -> None:
    """5 processes, 2 slots: at most 2 inside at any moment, and 2 at once at some point."""
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True) for _ in range(5)
    ]
    events: list[tuple[float, int]] = []
    for worker in workers:
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        for line in out.split("\n"):
            if line:
                kind, when = line.split()
                events.append((float(when), 1 if kind == "in" else -1))
    inside, most = 0, 0
    for _, step in sorted(events, key=lambda event: (event[0], event[1])):
        inside += step
        most = max(most, inside)
    assert most == 2
