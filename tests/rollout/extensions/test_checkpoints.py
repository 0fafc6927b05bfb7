"""`reroll.rollout.extensions.checkpoints`: `pool_reference` (a checkpoint's kept copy-on-write
snapshot, or None when it has none or its record is unreadable) and `retained` (which per-step
checkpoints a run keeps)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from reroll.rollout.extensions.checkpoints import kept_pool, pool_reference, retained
from reroll.runfolder.paths import POOL_FILE


def test_pool_reference_reads_the_record_and_falls_back_to_none(tmp_path: Path) -> None:
    assert pool_reference(tmp_path) is None  # a tar-only checkpoint
    (tmp_path / POOL_FILE).write_text('{"from_snapshot": "/tmp/reroll-local-disk-x:step-3"}')
    assert pool_reference(tmp_path) == "/tmp/reroll-local-disk-x:step-3"
    for broken in ("not json", "[]", '{"from_snapshot": 3}'):
        (tmp_path / POOL_FILE).write_text(broken)
        assert pool_reference(tmp_path) is None


@pytest.mark.parametrize("steps", [1, 5, 8])
def test_a_run_of_at_most_keep_steps_keeps_every_step(steps: int) -> None:
    assert retained(range(1, steps + 1), 8) == set(range(1, steps + 1))


@pytest.mark.parametrize("keep", [2, 8, 64])
def test_a_longer_run_keeps_the_latest_every_step_and_thins_the_earlier_ones(keep: int) -> None:
    kept: list[int] = []
    for step in range(1, 400):  # as the run goes: each step added, the retention applied
        kept = sorted(retained([*kept, step], keep))
        assert len(kept) <= keep
        latest = list(range(max(step - keep // 2 + 1, 1), step + 1))
        assert kept[-len(latest) :] == latest  # the latest, every step
    earlier = kept[: -(keep // 2)]
    gaps = {b - a for a, b in itertools.pairwise(earlier)}
    assert len(gaps) <= 1 and earlier[0] == min(gaps or {earlier[0]})  # an even stride from the start


@pytest.mark.parametrize(
    ("pool", "backend"), [("reroll-disk-run-x", "docker"), ("reroll-local-disk-run-x", "local")]
)
def test_a_pool_is_used_only_by_the_backend_that_kept_it(tmp_path: Path, pool: str, backend: str) -> None:
    reference = f"{tmp_path / pool}:step-3"
    (tmp_path / "step-3").mkdir()
    (tmp_path / "step-3" / POOL_FILE).write_text(f'{{"from_snapshot": "{reference}"}}')
    other = "local" if backend == "docker" else "docker"
    assert kept_pool(tmp_path / "step-3", other) == (
        None,
        f"the pool snapshot {reference} needs the {backend} sandbox; restoring the layers",
    )
    found, note = kept_pool(tmp_path / "step-3", backend)  # its own: no such pool here
    assert found is None and note is not None and "is gone" in note
