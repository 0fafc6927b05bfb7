"""`reroll_contracts.btrfs.freeze` on a real loop-mounted btrfs: every subvolume frozen read-only, the
paths file written last (a failed freeze leaves no snapshot), and a taken folder refused."""

from __future__ import annotations

import errno

import pytest
from reroll.sandbox.docker.disk import SizedDisk
from reroll_contracts.btrfs import PATHS, ROOT, create_subvolume, freeze, is_subvolume

from tests.conftest import NEEDS_BTRFS

pytestmark = NEEDS_BTRFS


def test_freeze_makes_read_only_snapshots_then_the_paths_file(btrfs_disk: SizedDisk) -> None:
    base = btrfs_disk.mountpoint
    for name in ("app", "home", "root"):
        create_subvolume(base / name)
        (base / name / "mine").write_text(name)
    freeze(base / "step-1", [base / "app", base / "home"], ["/app", "/home/agent"], base / "root")
    (base / "app" / "mine").write_text("later")
    frozen = base / "step-1"
    assert (frozen / PATHS).read_text() == "/app\n/home/agent"
    assert [(frozen / name / "mine").read_text() for name in ("0", "1", ROOT)] == ["app", "home", "root"]
    for name in ("0", "1", ROOT):
        assert is_subvolume(frozen / name)
        with pytest.raises(OSError) as raised:
            (frozen / name / "new").write_text("x")
        assert raised.value.errno == errno.EROFS
    with pytest.raises(FileExistsError):
        freeze(frozen, [base / "app"], ["/app"])


def test_a_failed_freeze_leaves_no_paths_file(btrfs_disk: SizedDisk) -> None:
    base = btrfs_disk.mountpoint
    create_subvolume(base / "app")
    (base / "plain").mkdir()
    with pytest.raises(OSError):
        freeze(base / "step-1", [base / "app", base / "plain"], ["/app", "/home/agent"])
    assert is_subvolume(base / "step-1" / "0") and not (base / "step-1" / PATHS).exists()
