"""The sidecar bundle's Python sources, staged as `sidecar_bundle` stages them (no Docker needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.sandbox.sidecar_bundle import sidecar_lib


@pytest.mark.spawns
def test_the_sidecar_lib_runs_the_sidecar_on_its_own(tmp_path: Path) -> None:
    """Only the files the bundle is frozen from: the sidecar finds the exception tree among them,
    and no more of the controller than ``reroll/errors.py`` (under an empty ``reroll/__init__.py``)."""
    lib = tmp_path / "lib"
    for relative, content in sidecar_lib():
        (lib / relative).parent.mkdir(parents=True, exist_ok=True)
        (lib / relative).write_bytes(content)
    assert sorted(p.name for p in (lib / "reroll").iterdir()) == ["__init__.py", "errors.py"]
    assert "import" not in (lib / "reroll" / "__init__.py").read_text()
    probe = "import reroll.errors, reroll_sidecar.server; print(reroll.errors.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(lib)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(lib / "reroll" / "errors.py")
