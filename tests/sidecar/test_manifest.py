"""The workspace manifest in process: what `tree_manifest` records for each kind of entry."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from pathlib import Path

import pytest
from reroll_sidecar.manifest import tree_manifest


def test_manifest_records_every_kind_and_opens_only_regular_files(tmp_path: Path) -> None:
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "b.txt").write_bytes(b"b")
    (tmp_path / "deep" / "link-to-root").symlink_to(tmp_path)  # a loop, were it followed
    os.mkfifo(tmp_path / "pipe")  # opening it would block
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "sock"))
        manifest = tree_manifest(str(tmp_path))
    assert manifest == {
        "deep/er/b.txt": hashlib.sha256(b"b").hexdigest(),
        "deep/link-to-root": f"symlink:{tmp_path}",
        "pipe": "fifo:",
        "sock": "socket:",
    }


def test_manifest_of_a_link_or_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path)
    for root in ("file", "link"):
        with pytest.raises(NotADirectoryError, match="is not a folder"):
            tree_manifest(str(tmp_path / root))


@pytest.mark.spawns
@pytest.mark.skipif(os.geteuid() != 0, reason="bind-mounts need root")
def test_a_folder_mounted_below_the_tree_is_left_out(tmp_path: Path) -> None:
    """What is bound in (the agents folder under a ``/root`` workspace) is not what the agent wrote:
    a large one once overflowed the Manifest reply (gRPC's 4 MiB)."""
    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    (tree / "bound").mkdir(parents=True)
    elsewhere.mkdir()
    (tree / "written.txt").write_text("mine\n")
    (elsewhere / "installed.bin").write_text("not the agent's\n")
    subprocess.run(["mount", "--bind", str(elsewhere), str(tree / "bound")], check=True)
    try:
        assert list(tree_manifest(str(tree))) == ["written.txt"]
    finally:
        subprocess.run(["umount", str(tree / "bound")], check=True)
