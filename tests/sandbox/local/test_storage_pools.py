"""Which kept pools `reroll.sandbox.local.storage` removes, on plain folders laid out as pools
(no file system mounted): a pool whose run folder is gone goes at once (``reroll sandbox prune``),
one whose run exists stays for its retention time; `cap_pools` removes the oldest beyond the
count; `remove_pools_under` only those whose run lies in the folder given."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.sandbox.docker.disk import LOCAL_PREFIX
from reroll.sandbox.local import storage


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[list[Path]]:
    """Three pool folders (oldest first) kept by runs of `tmp_path`; removed afterwards."""
    made = []
    for index in range(3):
        folder = Path(tempfile.mkdtemp(prefix=f"{LOCAL_PREFIX}test-pools-{index}-"))
        (folder / storage.KEPT).write_text(f"{time.time() - 10 + index:.6f}")
        run = tmp_path / f"run-{index}"
        run.mkdir()
        (folder / storage.RUN_FILE).write_text(str(run))
        made.append(folder)
    yield made
    for folder in made:
        if folder.exists():
            for file in folder.iterdir():
                file.unlink()
            folder.rmdir()


def test_a_pool_of_a_deleted_run_is_no_longer_in_use(pools: list[Path], tmp_path: Path) -> None:
    assert all(storage.in_use(pool) for pool in pools)  # kept recently, its run there
    (tmp_path / "run-1").rmdir()
    assert [storage.in_use(pool) for pool in pools] == [True, False, True]
    (pools[0] / storage.KEPT).write_text(f"{time.time() - storage.POOL_KEEP_SECONDS - 1:.6f}")
    assert not storage.in_use(pools[0])  # kept too long ago


def test_cap_pools_removes_the_oldest_beyond_the_count(pools: list[Path]) -> None:
    assert storage.cap_pools(1, pools) == pools[:2]
    assert [pool.exists() for pool in pools] == [False, False, True]


def test_remove_pools_under_takes_only_the_pools_of_runs_in_the_folder(
    pools: list[Path], tmp_path: Path
) -> None:
    (pools[2] / storage.RUN_FILE).write_text("/elsewhere/run")
    removed = storage.remove_pools_under(tmp_path)
    assert sorted(removed) == sorted(pools[:2]) and pools[2].exists()
