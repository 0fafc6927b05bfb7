"""`reroll.rollout.extensions.checkpoints.pool_reference`: a checkpoint's kept copy-on-write
snapshot, or None when it has none or its record is unreadable."""

from __future__ import annotations

from pathlib import Path

from reroll.rollout.extensions.checkpoints import POOL_FILE, pool_reference


def test_pool_reference_reads_the_record_and_falls_back_to_none(tmp_path: Path) -> None:
    assert pool_reference(tmp_path) is None  # a tar-only checkpoint
    (tmp_path / POOL_FILE).write_text('{"from_snapshot": "/tmp/reroll-local-disk-x:step-3"}')
    assert pool_reference(tmp_path) == "/tmp/reroll-local-disk-x:step-3"
    for broken in ("not json", "[]", '{"from_snapshot": 3}'):
        (tmp_path / POOL_FILE).write_text(broken)
        assert pool_reference(tmp_path) is None
