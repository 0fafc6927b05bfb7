"""The host's own CPython builds (pyenv's on reroll's machines), which reroll lends where no
registry it reaches has an interpreter: the agents' relocatable runtime
(`reroll.installs.python_runtime`) and the catalogue's ``python:3.10`` / ``python:3.12``
stand-ins (`reroll.sandbox.docker.python_standin`)."""

from __future__ import annotations

import glob
import re
import shutil
from pathlib import Path

PYENV_VERSIONS = "/root/.pyenv/versions"
"""Where reroll's machines keep pyenv's interpreters (``<version>/bin/pythonX.Y``)."""


def host_python(version: str) -> Path | None:
    """The host's CPython `version` (``3.12``): pyenv's newest ``3.12.*`` under
    `PYENV_VERSIONS`, else ``python3.12`` on PATH (not a pyenv shim); None when there is
    neither. The path is resolved."""
    candidates = sorted(
        glob.glob(f"{PYENV_VERSIONS}/{version}.*/bin/python{version}"),
        key=lambda path: [int(part) for part in re.findall(r"\d+", Path(path).parts[-3])],
    )
    found = candidates[-1] if candidates else shutil.which(f"python{version}")
    if found is None or "/shims/" in found:
        return None
    return Path(found).resolve()
