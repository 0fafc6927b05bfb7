"""CRIU's install: the packages apt names, the version it checks, the command it builds; and that
it refuses a host without apt rather than installing anything into the host's system."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reroll.sandbox.local import criu_install as criu
from reroll.sandbox.local.criu_install import CriuInstall, dependency_closure, parse_version
from reroll_contracts.errors import ImageBuildError

DEPENDS = """criu
  Depends: libbsd0
  Depends: <libc6-udeb>
libbsd0
  Depends: libc6
libc6
  Depends: libgcc-s1
<virtual-thing>
libgcc-s1
libc6
"""


def test_the_closure_is_every_package_line_once_without_virtual_packages() -> None:
    assert dependency_closure(DEPENDS) == ["criu", "libbsd0", "libc6", "libgcc-s1"]


def test_an_unexpected_line_is_refused_not_passed_to_apt() -> None:
    with pytest.raises(ImageBuildError, match="unexpected line"):
        dependency_closure("criu\n-oAPT::Something=evil\n")


def test_the_version_is_read_from_criu_s_own_words() -> None:
    assert parse_version("Version: 4.2.1\nGitID: v4.2.1\n") == (4, 2, 1)
    assert parse_version("Version: 4.1.1\n") < criu.MIN_VERSION  # type: ignore[operator]
    assert parse_version("criu: command not found") is None


def test_criu_runs_through_its_own_loader_and_libraries() -> None:
    install = CriuInstall(Path("/cache/criu/sid-1/root"))
    argv = install.argv("check", root=Path("/proc/self/fd/7"))
    assert argv == [
        "/proc/self/fd/7/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        "--library-path",
        "/proc/self/fd/7/usr/lib/x86_64-linux-gnu",
        "/proc/self/fd/7/usr/sbin/criu",
        "check",
    ]
    assert install.argv()[0] == "/cache/criu/sid-1/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"


def test_a_host_without_apt_is_told_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "apt-get" else f"/usr/bin/{name}")
    with pytest.raises(ImageBuildError, match="needs apt-get"):
        criu.ensure_criu()
    assert not (tmp_path / "criu" / f"{criu.SUITE}-{criu.INSTALL_FORMAT}" / ".complete").exists()
