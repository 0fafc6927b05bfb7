"""`read_data_file`: no symlink followed below the run folder, no FIFO waited on, a cap per file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reroll_contracts.datafile import DataFileError, read_data_file

pytestmark = pytest.mark.timeout(10)


def test_a_regular_file_below_the_root_is_read(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.json").write_bytes(b"{}")
    assert read_data_file(tmp_path / "a" / "b" / "f.json", 2, root=tmp_path) == b"{}"


def test_a_folder_on_the_way_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "f.json").write_bytes(b"host secret")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trajectory").symlink_to(tmp_path / "host")
    with pytest.raises(DataFileError, match="its folder trajectory is a symlink or not a folder"):
        read_data_file(tmp_path / "run" / "trajectory" / "f.json", 100, root=tmp_path / "run")
    assert read_data_file(tmp_path / "run" / "trajectory" / "f.json", 100) == b"host secret"  # no root


def test_a_path_outside_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(DataFileError, match="not inside"):
        read_data_file(tmp_path / "f", 10, root=tmp_path / "run")
    with pytest.raises(DataFileError, match="not a path inside"):
        read_data_file(tmp_path / "run" / ".." / "f", 10, root=tmp_path / "run")


def test_a_fifo_a_folder_and_a_file_past_its_cap_are_refused_unread(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataFileError, match="not a regular file"):
        read_data_file(tmp_path / "fifo", 10, root=tmp_path)
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataFileError, match="not a regular file"):
        read_data_file(tmp_path / "dir", 10)
    with open(tmp_path / "big", "wb") as file:
        file.truncate(2 * 1024**3)
    with pytest.raises(DataFileError, match="2147483648 bytes, more than the cap of 64 MiB"):
        read_data_file(tmp_path / "big", 64 * 1024**2, root=tmp_path)
