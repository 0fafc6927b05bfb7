"""The integrity check of shared installs (`reroll.installs.store`): every change to an
installed tree is found — also one that keeps the file's size and mtime, or plants byte code —
and a refused unit is moved aside and deleted. Real files on the host's file system; no process."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from reroll.installs.python_runtime import PYENV_VERSIONS
from reroll.installs.store import NOT_INSTALLED, InstallStore, check_tree, record_tree
from reroll_contracts.errors import AgentInstallError


def make_unit(folder: Path) -> Path:
    """A small install: a venv-like tree with a script, byte code and a symlink."""
    (folder / "venv" / "bin").mkdir(parents=True)
    (folder / "venv" / "bin" / "tool").write_text("#!/bin/sh\necho honest\n")
    (folder / "venv" / "bin" / "tool").chmod(0o755)
    (folder / "venv" / "lib" / "__pycache__").mkdir(parents=True)
    (folder / "venv" / "lib" / "mod.py").write_text("x = 1\n")
    (folder / "venv" / "lib" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"\x01" * 64)
    (folder / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    return folder


def same_size_same_mtime(path: Path, content: bytes) -> None:
    """Rewrite `path` with `content` (as long as the old one) and put its mtime back."""
    before = path.stat()
    assert len(content) == before.st_size
    path.write_bytes(content)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def replace(path: Path, make: Callable[[Path], None]) -> None:
    """Remove `path`, then make something else there with `make`."""
    path.unlink()
    make(path)


TAMPERS: dict[str, Callable[[Path], object]] = {
    "content, same size and mtime": lambda u: same_size_same_mtime(
        u / "venv/bin/tool", b"#!/bin/sh\necho POISON\n"
    ),
    "byte code": lambda u: same_size_same_mtime(u / "venv/lib/__pycache__/mod.cpython-312.pyc", b"\x02" * 64),
    "added .pth": lambda u: (u / "venv/lib/evil.pth").write_text("import os\n"),
    "removed": lambda u: (u / "venv/lib/mod.py").unlink(),
    "mode": lambda u: (u / "venv/bin/tool").chmod(0o777),
    "symlink target": lambda u: replace(u / "venv/bin/python", lambda path: path.symlink_to("/tmp/evil")),
    "file replaced by a folder": lambda u: replace(u / "venv/lib/mod.py", Path.mkdir),
}


def test_an_untouched_tree_passes_fast_and_full(tmp_path: Path) -> None:
    unit = make_unit(tmp_path / "unit")
    recorded = record_tree(unit)
    assert set(recorded) == {
        ".", "venv", "venv/bin", "venv/bin/tool", "venv/bin/python", "venv/lib", "venv/lib/mod.py",
        "venv/lib/__pycache__", "venv/lib/__pycache__/mod.cpython-312.pyc",
    }  # fmt: skip
    assert recorded["venv/bin/python"][0::8] == ["l", "/usr/bin/python3"]
    assert check_tree(unit, recorded) == ""
    assert check_tree(unit, recorded, full=True) == ""


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_every_change_is_found(tamper: str, tmp_path: Path) -> None:
    unit = make_unit(tmp_path / "unit")
    recorded = record_tree(unit)
    TAMPERS[tamper](unit)
    reason = check_tree(unit, recorded)
    assert reason, f"{tamper} not found"
    assert "after the install" in reason or "points elsewhere" in reason, reason


def test_a_change_that_keeps_size_and_mtime_is_found_by_its_hash(tmp_path: Path) -> None:
    """The inode's ctime moved (no process can set it back): the file is hashed again."""
    unit = make_unit(tmp_path / "unit")
    recorded = record_tree(unit)
    TAMPERS["content, same size and mtime"](unit)
    assert check_tree(unit, recorded) == "venv/bin/tool changed after the install (sha256 differs)"


def test_the_store_refuses_a_unit_without_manifest_and_discards_it(tmp_path: Path) -> None:
    store = InstallStore(folder=tmp_path / "agents", manifests=tmp_path / "manifests")
    assert store.check("tool-1") == NOT_INSTALLED
    make_unit(store.folder / "tool-1")
    assert "has no manifest" in store.check("tool-1")
    assert store.record("tool-1", []) == {"entries": 9, "bytes": 22 + 6 + 64}  # symlinks count 0
    assert store.check("tool-1") == ""
    assert (store.manifests.stat().st_mode & 0o777) == 0o700
    assert json.loads(store.manifest_file("tool-1").read_text())["format"] == 1
    store.discard("tool-1")
    assert not (store.folder / "tool-1").exists() and not store.manifest_file("tool-1").exists()
    assert list(store.folder.iterdir()) == [], "moved aside, then deleted"


def test_a_unit_is_refused_when_an_install_it_requires_changed(tmp_path: Path) -> None:
    store = InstallStore(folder=tmp_path / "agents", manifests=tmp_path / "manifests")
    make_unit(store.folder / "python3.12-abc")
    store.record("python3.12-abc", [])
    make_unit(store.folder / "agent-1")
    store.record("agent-1", ["python3.12-abc"])
    assert store.check("agent-1") == ""
    (store.folder / "python3.12-abc" / "venv" / "lib" / "sitecustomize.py").write_text("import os\n")
    assert store.check("agent-1") == (
        "the install it requires, python3.12-abc: venv/lib/sitecustomize.py was added after the install"
    )


def test_an_install_on_the_hosts_own_pyenv_python_is_installed_again(tmp_path: Path) -> None:
    """A venv an older reroll made on the host's pyenv interpreter (in ``local-plain``) fails in
    the isolated ``local`` sandbox, which shares the store but not the host's pyenv."""
    store = InstallStore(folder=tmp_path / "agents", manifests=tmp_path / "manifests")
    make_unit(store.folder / "agent-1")
    (store.folder / "agent-1" / "venv" / "bin" / "python3.12").symlink_to(
        f"{PYENV_VERSIONS}/3.12.1/bin/python3.12"
    )
    store.record("agent-1", [])
    assert store.check("agent-1") == (
        f"venv/bin/python3.12 runs the host's own {PYENV_VERSIONS}/3.12.1/bin/python3.12, "
        "which the isolated sandboxes do not see"
    )


@pytest.mark.parametrize("name", ["../escape", ".hidden", "a/b", ""])
def test_a_unit_name_is_one_plain_folder_name(name: str, tmp_path: Path) -> None:
    store = InstallStore(folder=tmp_path / "agents", manifests=tmp_path / "manifests")
    with pytest.raises(AgentInstallError, match="cannot name an install folder"):
        store.check(name)
