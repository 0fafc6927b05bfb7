"""The no-follow helpers root uses on the agent's trees: never through a symlinked folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reroll_sidecar import nofollow


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace whose ``tests`` folder the agent replaced by a symlink to an outside folder."""
    workspace, outside = tmp_path / "workspace", tmp_path / "outside"
    workspace.mkdir()
    outside.mkdir()
    (outside / "conftest.py").write_text("outside")
    (workspace / "tests").symlink_to(outside)
    return workspace, outside


def test_secure_parent_refuses_a_symlinked_folder(tree: tuple[Path, Path]) -> None:
    workspace, _ = tree
    with (
        pytest.raises(nofollow.UnsafePath, match="tests is a symlink"),
        nofollow.secure_parent(str(workspace / "tests" / "conftest.py"), str(workspace)),
    ):
        pass


def test_secure_parent_replaces_a_symlinked_folder_and_notes_it(tree: tuple[Path, Path]) -> None:
    workspace, outside = tree
    notes: list[str] = []
    target = workspace / "tests" / "conftest.py"
    with nofollow.secure_parent(str(target), str(workspace), replace=True, notes=notes) as (folder, name):
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        os.write(fd, b"restored")
        os.close(fd)
    assert (workspace / "tests").is_dir() and not (workspace / "tests").is_symlink()
    assert target.read_text() == "restored"
    assert (outside / "conftest.py").read_text() == "outside"
    replaced = f"{workspace}/tests was a symlink (owner uid {os.getuid()}): replaced by an empty folder"
    assert notes == [replaced]


def test_secure_parent_creates_missing_folders_only_when_replacing(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "file"
    with pytest.raises(FileNotFoundError), nofollow.secure_parent(str(path), str(tmp_path)):
        pass
    with nofollow.secure_parent(str(path), str(tmp_path), replace=True):
        pass
    assert (tmp_path / "a" / "b").is_dir()


def test_the_trusted_folder_itself_may_be_reached_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert nofollow.lexists(str(tmp_path / "link" / "file"), str(tmp_path / "link"))
    assert not nofollow.lexists(str(tmp_path / "link" / "file"), str(tmp_path))


def test_secure_parent_rejects_a_path_outside_the_trusted_folder(tmp_path: Path) -> None:
    with (
        pytest.raises(nofollow.UnsafePath, match="is not below"),
        nofollow.secure_parent("/etc/passwd", str(tmp_path)),
    ):
        pass
    with (
        pytest.raises(nofollow.UnsafePath, match="not an absolute path"),
        nofollow.secure_parent("relative/file", str(tmp_path)),
    ):
        pass


def test_unlink_never_deletes_through_a_symlinked_folder(tree: tuple[Path, Path]) -> None:
    workspace, outside = tree
    assert not nofollow.unlink(str(workspace / "tests" / "conftest.py"), str(workspace))
    assert (outside / "conftest.py").exists()
    (workspace / "hook.pth").symlink_to(outside / "conftest.py")
    assert nofollow.unlink(str(workspace / "hook.pth"), str(workspace))
    assert not (workspace / "hook.pth").is_symlink() and (outside / "conftest.py").exists()
    assert not nofollow.unlink(str(workspace / "missing"), str(workspace))


def test_lexists_counts_a_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert nofollow.lexists(str(tmp_path / "dangling"), str(tmp_path))
    assert not nofollow.lexists(str(tmp_path / "nowhere"), str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_chown_root_changes_the_link_not_its_target(tree: tuple[Path, Path]) -> None:
    workspace, outside = tree
    os.chown(outside / "conftest.py", 1234, 1234)
    (workspace / "link").symlink_to(outside / "conftest.py")
    os.lchown(workspace / "link", 1234, 1234)
    assert nofollow.chown_root(str(workspace / "link"), str(workspace))
    assert os.lstat(workspace / "link").st_uid == 0
    assert os.stat(outside / "conftest.py").st_uid == 1234
    assert not nofollow.chown_root(str(workspace / "tests" / "conftest.py"), str(workspace))
    assert os.stat(outside / "conftest.py").st_uid == 1234


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_hand_tree_to_root_takes_the_tree_and_never_what_its_links_name(tree: tuple[Path, Path]) -> None:
    """The workspace handed to root before a verify that keeps the agent's processes: nothing in
    it is theirs or writable by others afterwards, and the symlinked folder's target is untouched."""
    workspace, outside = tree
    (workspace / "sub").mkdir()
    (workspace / "sub" / "open.txt").write_text("x")
    os.chmod(workspace / "sub" / "open.txt", 0o666)
    os.chmod(workspace / "sub", 0o777)
    mine = (outside, outside / "conftest.py", workspace, workspace / "sub", workspace / "sub" / "open.txt")
    for path in mine:
        os.chown(path, 1234, 1234)
    os.lchown(workspace / "tests", 1234, 1234)
    assert nofollow.hand_tree_to_root(str(workspace)) == 4  # workspace, tests (the link), sub, open.txt
    for path in (workspace, workspace / "sub", workspace / "sub" / "open.txt"):
        assert (os.lstat(path).st_uid, os.lstat(path).st_mode & 0o022) == (0, 0), path
    assert os.lstat(workspace / "tests").st_uid == 0
    assert (os.stat(outside).st_uid, os.stat(outside / "conftest.py").st_uid) == (1234, 1234)
    assert os.stat(outside / "conftest.py").st_mode & 0o777 == 0o644
