"""The sized file system of a docker sandbox (`reroll.sandbox.docker.disk`): a failed step leaves nothing."""

from __future__ import annotations

import pytest
from reroll.sandbox.docker import disk
from reroll_contracts.errors import SandboxError


def test_a_failed_mount_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_at_mount(argv: list[str]) -> None:
        if argv[0] == "mount":
            raise SandboxError("the sandbox's disk quota: mount failed: no loop device")

    monkeypatch.setattr(disk, "_run", fail_at_mount)
    before = set(disk.leftovers())
    with pytest.raises(SandboxError, match="no loop device"):
        disk.SizedDisk.create("test-disk", 1 << 20, {"app": 0o755}, owner="")
    assert set(disk.leftovers()) == before
