"""The Makefile's `make env`: reroll's own sources compiled where the interpreter reads them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()


def _variable(name: str) -> str:
    """The value of the Makefile's `name :=` line."""
    found = re.search(rf"^{name} := (.*)$", MAKEFILE, re.MULTILINE)
    assert found, f"the Makefile sets no {name}"
    return found.group(1)


def _recipe(target: str) -> list[str]:
    """The command lines of the Makefile's `target` (tab-indented, after its rule line)."""
    rule = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, re.MULTILINE)
    assert rule, f"the Makefile has no recipe for {target}"
    return [line.removeprefix("\t") for line in rule.group(1).splitlines()]


def test_env_compiles_every_package_folder() -> None:
    """A package folder added to pyproject.toml but not to the bytecode's list would be compiled
    at each start of every process (PYTHONDONTWRITEBYTECODE: no import writes it)."""
    where = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert _variable("BYTECODE_FOLDERS").split() == where["where"]
    assert "bytecode" in re.search(r"^env: (.*)$", MAKEFILE, re.MULTILINE).group(1).split()  # type: ignore[union-attr]


@pytest.mark.spawns
def test_the_bytecode_recipe_writes_where_an_import_reads(tmp_path: Path) -> None:
    """Under PYTHONDONTWRITEBYTECODE and PYTHONPYCACHEPREFIX (as this machine's sessions set),
    the recipe's compileall writes into the prefix and a fresh interpreter imports from it: the
    source is changed afterwards, same size and time, and the compiled value still comes back."""
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    module = package / "mod.py"
    module.write_text("VALUE = 1\n")
    (package / "__init__.py").write_text("")
    prefix = tmp_path / "pycache"
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(prefix)}
    (command,) = _recipe("bytecode")
    argv = command.replace("$(BIN)/python", sys.executable).replace("$(BYTECODE_FOLDERS)", "src").split()
    subprocess.run(argv, cwd=tmp_path, env=env, check=True)
    assert not list(package.glob("__pycache__")), "compileall wrote beside the sources despite the prefix"
    stat = module.stat()
    module.write_text("VALUE = 2\n")  # the same size: only a compiled copy still says 1
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    imported = subprocess.run(
        [sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE)"],
        cwd=tmp_path / "src",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "1"
