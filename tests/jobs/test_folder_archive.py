"""Folders packed on one machine and unpacked on another: a round trip keeps what a rollout needs,
the content hash ignores times, and every way out of the target folder is refused."""

from __future__ import annotations

import gzip
import io
import os
import socket
import tarfile
from pathlib import Path

import pytest
from reroll.jobs.folder_archive import pack, pack_file, unpack
from reroll_contracts.errors import JobError, RunFolderError


def make_folder(root: Path) -> Path:
    (root / "sub" / "empty").mkdir(parents=True)
    (root / "task.md").write_text("hello\n")
    (root / "sub" / "solve.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "sub" / "solve.sh").chmod(0o755)
    (root / "link").symlink_to("sub/solve.sh")
    (root / "hard").hardlink_to(root / "task.md")  # packed as a second file
    return root


def test_round_trip_keeps_files_modes_links_and_empty_folders(tmp_path: Path) -> None:
    packed = pack(make_folder(tmp_path / "src"))
    unpack(packed.data, tmp_path / "out", source="test")
    out = tmp_path / "out"
    assert (out / "task.md").read_text() == (out / "hard").read_text() == "hello\n"
    assert os.access(out / "sub" / "solve.sh", os.X_OK)
    assert os.readlink(out / "link") == "sub/solve.sh"
    assert (out / "sub" / "empty").is_dir()
    assert pack(out).digest == packed.digest


def test_sockets_and_fifos_are_left_out(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "src")
    os.mkfifo(folder / "fifo")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(folder / "sock"))
        unpack(pack(folder).data, tmp_path / "out", source="test")
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["hard", "link", "sub", "task.md"]


def test_the_digest_follows_content_not_times(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "src")
    first = pack(folder).digest
    os.utime(folder / "task.md", (0, 0))
    assert pack(folder).digest == first
    (folder / "task.md").write_text("changed\n")
    assert pack(folder).digest != first


def test_pack_refuses_a_link_out_of_the_folder(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "src")
    (folder / "sub" / "out").symlink_to("../../elsewhere")
    with pytest.raises(JobError, match="outside"):
        pack(folder)


def test_unpack_into_an_existing_folder_is_refused(tmp_path: Path) -> None:
    packed = pack(make_folder(tmp_path / "src"))
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        unpack(packed.data, tmp_path / "out", source="test")


def hostile(*members: tarfile.TarInfo) -> bytes:
    """An archive of `members` (files get the content ``x``) as `pack` would send it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x") if member.isreg() else None)
    return gzip.compress(raw.getvalue())


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("members", "refusal"),
    [
        ([member("/etc/evil")], "absolute"),
        ([member("../evil")], "climbing out"),
        ([member("a/../../evil")], "climbing out"),
        ([member("up", tarfile.SYMTYPE, "../..")], "outside"),
        ([member("abs", tarfile.SYMTYPE, "/etc")], "outside"),
        # a link that stays inside, then a file written through it: refused by name
        ([member("d", tarfile.SYMTYPE, "."), member("d/evil")], "under a link"),
        ([member("hard", tarfile.LNKTYPE, "/etc/passwd")], "not a file"),
        ([member("fifo", tarfile.FIFOTYPE)], "not a file"),
        ([member("dev", tarfile.CHRTYPE)], "not a file"),
    ],
)
def test_unpack_refuses_every_way_out(tmp_path: Path, members: list[tarfile.TarInfo], refusal: str) -> None:
    """The attack: a run folder archive made by a hostile worker. Nothing at all is written."""
    with pytest.raises(RunFolderError, match=refusal):
        unpack(hostile(*members), tmp_path / "out", source="hostile")
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "evil").exists()


def test_unpack_refuses_what_is_not_an_archive(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="hostile: not a packed folder"):
        unpack(b"not gzip", tmp_path / "out", source="hostile")
    assert list(tmp_path.iterdir()) == []


def test_a_file_travels_as_a_folder_holding_it(tmp_path: Path) -> None:
    """A ``scripted:PATH`` script outside any folder that travels: packed alone, under its name,
    with a digest of its content (not of its folder's other files, nor its times)."""
    (tmp_path / "src").mkdir()
    script = tmp_path / "src" / "fast.yaml"
    script.write_text("steps: []\n")
    (tmp_path / "src" / "other.txt").write_text("not packed\n")
    packed = pack_file(script)
    unpack(packed.data, tmp_path / "out", source="test")
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["fast.yaml"]
    assert (tmp_path / "out" / "fast.yaml").read_text() == "steps: []\n"
    os.utime(script, (0, 0))
    assert pack_file(script).digest == packed.digest
    script.write_text("steps: [changed]\n")
    assert pack_file(script).digest != packed.digest


def test_pack_file_refuses_links_and_special_files(tmp_path: Path) -> None:
    """A link named as a file is not followed (it could name any file of the controller), a FIFO
    is refused without being opened (reading it would block), a folder is not a file."""
    (tmp_path / "link.yaml").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "fifo.yaml")
    for name in ("link.yaml", "fifo.yaml"):
        with pytest.raises(JobError, match=f"{name}: not a regular file"):
            pack_file(tmp_path / name)
    with pytest.raises(JobError, match="not a regular file"):
        pack_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        pack_file(tmp_path / "missing.yaml")
