"""The snapshot store on its own: methods per file system, tar member ranges, the guard, errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from reroll_contracts.errors import SnapshotError
from reroll_sidecar import snapshot_io
from reroll_sidecar.snapshots import ARCHIVE, CLONE_MIN_BYTES, STAMPS, SnapshotStore


def make_tree(root: Path) -> bytes:
    """A folder with a large file (cloned where the file system can) and a small one; returns the large."""
    big = os.urandom(4 * CLONE_MIN_BYTES)
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "big.bin").write_bytes(big)
    (root / "small.txt").write_text("small")
    return big


async def test_a_file_system_that_clones_gets_large_files_cloned(reflink_dir: Path) -> None:
    workspace = reflink_dir / "ws"
    big = make_tree(workspace)
    os.chmod(workspace / "sub" / "big.bin", 0o640)
    os.utime(workspace / "sub" / "big.bin", ns=(0, 978307200_000000000))
    store = SnapshotStore(str(reflink_dir / "state"))
    time.sleep(0.2)  # older than the snapshot: restore must tell the change by the stamps
    saved = await store.save("s", [str(workspace)])
    assert saved.method == "tar+reflink"
    assert saved.size_bytes >= len(big)
    assert os.path.getsize(Path(store.root, "s", ARCHIVE)) < len(big), "the large file went into the archive"
    with open(workspace / "sub" / "big.bin", "r+b") as edit:
        edit.write(b"changed in place")
    os.chmod(workspace / "sub" / "big.bin", 0o600)
    assert await store.restore("s") == [str(workspace)]
    restored = os.lstat(workspace / "sub" / "big.bin")
    assert (workspace / "sub" / "big.bin").read_bytes() == big
    assert (restored.st_mode & 0o7777, restored.st_mtime_ns) == (0o640, 978307200_000000000)
    assert (workspace / "small.txt").read_text() == "small"


@pytest.mark.spawns
async def test_a_file_system_without_clones_gets_everything_archived(tmp_path: Path) -> None:
    if snapshot_io.can_clone(str(tmp_path)):
        pytest.skip(f"{tmp_path} clones files")
    big = make_tree(tmp_path / "ws")
    saved = await SnapshotStore(str(tmp_path / "state")).save("s", [str(tmp_path / "ws")])
    assert saved.method == "tar"
    assert saved.size_bytes > len(big)


@pytest.mark.spawns
def test_member_ranges_make_archives_of_chosen_members_long_names_included(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    long_folder = tree / ("d" * 120)
    long_folder.mkdir(parents=True)
    (long_folder / "file").write_bytes(b"x" * 1000)
    (tree / "link").symlink_to("t" * 150)
    (tree / "plain").write_text("plain")
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", "--create", "--file", archive, "--directory", "/", str(tree)[1:]], check=True)
    ranges = snapshot_io.member_ranges(str(archive))
    chosen = [os.fsencode(long_folder / "file"), os.fsencode(tree / "link")]
    assert set(chosen) < set(ranges) and os.fsencode(long_folder) in ranges
    part = b"".join(snapshot_io.read_ranges(str(archive), [ranges[name] for name in chosen]))
    listed = subprocess.run(["tar", "--list", "--verbose"], input=part, capture_output=True, check=True)
    lines = listed.stdout.decode().splitlines()
    assert sorted(line.split()[5] for line in lines) == sorted(os.fsdecode(name)[1:] for name in chosen)
    assert any(line.endswith("t" * 150) for line in lines)


@pytest.mark.spawns
async def test_entries_changed_while_the_snapshot_runs_are_always_put_back(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "old").write_text("old")
    time.sleep(0.2)
    (workspace / "fresh").write_text("fresh")  # ctime within the margin: it may change as find and tar run
    store = SnapshotStore(str(tmp_path / "state"))
    await store.save("s", [str(workspace)])
    stamps = snapshot_io.parse_stamps(Path(store.root, "s", STAMPS).read_bytes())
    assert stamps[os.fsencode(workspace / "fresh")].endswith(snapshot_io.CHANGING)
    assert not stamps[os.fsencode(workspace / "old")].endswith(snapshot_io.CHANGING)
    ctimes = {name: os.lstat(workspace / name).st_ctime_ns for name in ("old", "fresh")}
    time.sleep(0.05)
    await store.restore("s")
    assert os.lstat(workspace / "old").st_ctime_ns == ctimes["old"]
    assert os.lstat(workspace / "fresh").st_ctime_ns != ctimes["fresh"], "put back although unchanged"
    ctime = os.lstat(workspace / "fresh").st_ctime_ns
    await store.restore("s")
    assert os.lstat(workspace / "fresh").st_ctime_ns == ctime, "once put back, its stamp is known"


@pytest.mark.parametrize("paths", [[], ["relative/path"], ["/"]])
async def test_bad_paths_are_refused(tmp_path: Path, paths: list[str]) -> None:
    with pytest.raises(SnapshotError, match="must be absolute") as raised:
        await SnapshotStore(str(tmp_path)).save("s", paths)
    assert raised.value.kind == "invalid"


@pytest.mark.spawns
@pytest.mark.parametrize("damage", [b"\xff" * 2048, b"truncated", b""])
async def test_a_damaged_archive_fails_naming_it(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "file").write_text("content")
    store = SnapshotStore(str(tmp_path / "state"))
    await store.save("s", [str(tmp_path / "ws")])
    archive = Path(store.root, "s", ARCHIVE)
    archive.write_bytes(damage if damage != b"truncated" else archive.read_bytes()[:1536])
    (tmp_path / "ws" / "file").unlink()
    with pytest.raises(SnapshotError, match=r"restore of snapshot 's': .*content\.tar is damaged") as raised:
        await store.restore("s")
    assert raised.value.kind == "failed"
    assert not (tmp_path / "ws" / "file").exists()


@pytest.mark.spawns
async def test_a_deleted_tree_comes_back_whole(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    files = {workspace / f"d{index % 7}" / f"f{index}": os.urandom(index * 97) for index in range(300)}
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    store = SnapshotStore(str(tmp_path / "state"))
    await store.save("s", [str(workspace)])
    shutil.rmtree(workspace)
    await store.restore("s")
    assert {path: path.read_bytes() for path in workspace.rglob("f*")} == files


@pytest.mark.spawns
async def test_entries_find_saw_but_tar_did_not_are_absent_unless_the_archive_is_damaged(
    tmp_path: Path,
) -> None:
    """find and tar run side by side: an entry created while they ran may be in the stamps only."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "kept").write_text("kept")
    store = SnapshotStore(str(tmp_path / "state"))
    await store.save("s", [str(workspace)])
    stamps_file = Path(store.root, "s", STAMPS)
    listing = stamps_file.read_bytes()
    (workspace / "late").write_text("late")  # as if created after tar read the folder, before find did
    late = os.fsencode(workspace / "late")
    late_stamp = snapshot_io.parse_stamps(
        await snapshot_io.run(["find", str(workspace / "late"), "-printf", snapshot_io.STAMP_FORMAT])
    )[late]
    stamps_file.write_bytes(listing + late + b"\0" + late_stamp + snapshot_io.CHANGING + b"\0")
    await store.restore("s")
    assert sorted(os.listdir(workspace)) == ["kept"]
    assert late not in snapshot_io.parse_stamps(stamps_file.read_bytes())
    stamps_file.write_bytes(listing + late + b"\0" + late_stamp + b"\0")  # not marked: the archive lost it
    with pytest.raises(SnapshotError, match=r"content\.tar lacks 1 saved entries, such as .*/late"):
        await store.restore("s")


@pytest.mark.spawns
async def test_restore_replaces_a_symlinked_folder_instead_of_writing_through_it(tmp_path: Path) -> None:
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    (workspace / "tests").mkdir(parents=True)
    outside.mkdir()
    hook = workspace / "tests" / "conftest.py"
    hook.write_text("the task's own hook")
    store = SnapshotStore(str(tmp_path / "state"))
    await store.save("baseline", [str(hook)], {str(hook): str(workspace)})
    shutil.rmtree(workspace / "tests")
    (workspace / "tests").symlink_to(outside)  # the agent's folder symlink
    with pytest.raises(SnapshotError, match="tests is a symlink"):
        await store.save("again", [str(hook)], {str(hook): str(workspace)})
    notes: list[str] = []
    assert await store.restore("baseline", notes) == [str(hook)]
    assert not (workspace / "tests").is_symlink() and hook.read_text() == "the task's own hook"
    assert list(outside.iterdir()) == []
    assert notes and "replaced by an empty folder" in notes[0]
