"""The host's CPython builds (`reroll.host.pythons`): which one stands for a minor."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.host import pythons
from reroll.host.pythons import host_python


def test_host_python_takes_pyenvs_newest_by_version_not_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for version in ("3.12.1", "3.12.10", "3.12.9", "3.11.7"):
        program = tmp_path / version / "bin" / ("python" + version.rsplit(".", 1)[0])
        program.parent.mkdir(parents=True)
        program.touch(mode=0o755)
    monkeypatch.setattr(pythons, "PYENV_VERSIONS", str(tmp_path))
    assert host_python("3.12") == tmp_path / "3.12.10" / "bin" / "python3.12"
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert host_python("3.13") is None
