"""What only the `local-plain` backend does: leave nothing on the host, clone large files on btrfs / XFS."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from reroll import conformance
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local.plain import LocalSandbox
from reroll.tasks.task import Task

pytestmark = pytest.mark.spawns  # every test starts a local sandbox (its sidecar)


async def test_stop_leaves_nothing_behind(task: Task) -> None:
    sandbox = LocalSandbox(sandbox_spec(task), "leftovers")
    await sandbox.start()
    await conformance.sh(sandbox, conformance.BACKGROUND_SLEEP)
    host_pid = int((await sandbox.get_file(f"{sandbox.layout.workspace}/bg.pid")).decode())
    await sandbox.stop()
    assert not Path(sandbox.layout.root).exists()
    stat = Path(f"/proc/{host_pid}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z", "a background process survived stop"


async def test_restore_is_exact_on_a_file_system_that_clones(
    task: Task, reflink_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend with its folder on btrfs or XFS: large files are cloned, not archived."""
    monkeypatch.setattr(tempfile, "tempdir", str(reflink_dir))
    sandbox = LocalSandbox(sandbox_spec(task), "reflink")
    assert Path(sandbox.layout.root).is_relative_to(reflink_dir)
    async with sandbox:
        await conformance.restore_hard_cases(sandbox)
        archive = Path(sandbox.layout.root, ".reroll", "state", "snapshots", "hard", "content.tar")
        assert archive.stat().st_size < 300_000, "the large file went into the archive, not cloned"
