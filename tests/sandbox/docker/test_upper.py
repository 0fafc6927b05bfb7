"""The copy of a container's writable layer (`reroll.sandbox.docker.upper.copy_tree`): the storage
driver's whiteouts, owners, modes and markers carried as they are; a link the agent planted is
copied as a link, never followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from reroll.sandbox.docker.upper import copy_tree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts (mknod) and owners need root")


def test_the_layer_is_copied_as_the_driver_wrote_it(tmp_path: Path) -> None:
    source, target = tmp_path / "upper", tmp_path / "copy"
    (source / "etc" / "x").mkdir(parents=True)
    target.mkdir()
    (source / "etc" / "foo").write_text("hi")
    os.chown(source / "etc" / "foo", 1000, 1000)
    (source / "etc" / "x").chmod(0o750)
    os.mknod(source / "etc" / "issue", stat.S_IFCHR, os.makedev(0, 0))  # a deletion
    (source / "etc" / "x" / ".wh..wh..opq").touch()
    os.setxattr(source / "etc" / "x", "trusted.overlay.opaque", b"y")
    os.link(source / "etc" / "foo", source / "etc" / "bar")
    copied = copy_tree(source, target)
    assert copied == 2 and (target / "etc" / "foo").read_text() == "hi"
    assert (target / "etc" / "foo").stat().st_uid == 1000
    assert stat.S_IMODE((target / "etc" / "x").stat().st_mode) == 0o750
    issue = (target / "etc" / "issue").lstat()
    assert stat.S_ISCHR(issue.st_mode) and issue.st_rdev == os.makedev(0, 0)
    assert (target / "etc" / "x" / ".wh..wh..opq").is_file()
    assert os.getxattr(target / "etc" / "x", "trusted.overlay.opaque") == b"y"
    assert (target / "etc" / "bar").stat().st_ino == (target / "etc" / "foo").stat().st_ino


def test_a_planted_link_is_copied_as_a_link_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    source, target = tmp_path / "upper", tmp_path / "copy"
    source.mkdir()
    target.mkdir()
    (source / "leak").symlink_to(secret)
    (source / "dir").symlink_to(tmp_path)
    copy_tree(source, target)
    assert os.readlink(target / "leak") == str(secret)  # a link, as in the container
    assert (target / "leak").is_symlink() and (target / "dir").is_symlink()
    assert not any(path.name == "host-secret" for path in target.rglob("*") if not path.is_symlink())
