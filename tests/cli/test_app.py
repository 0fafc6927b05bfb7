"""The CLI's start: ``reroll --help`` and every command's help load no command's implementation
(a fresh interpreter's `sys.modules` after them), so the heavy imports cannot come back silently."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spawns  # a fresh interpreter each: the one running the tests has it all loaded

HEAVY = ("docker", "aiohttp", "aiohttp.web", "requests", "reroll_proxy.scripted", "reroll.jobs.branch")
"""What no help may load: the docker SDK, aiohttp (client or server), the scripted model server,
a command's implementation."""

PROBE = """
import json, sys
from typer.main import get_command
from reroll.cli.app import app

def paths(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from paths(sub, [*path, name])

shown = []
for path in paths(get_command(app), []) if EVERY else [[]]:
    try:
        app([*path, "--help"])
    except SystemExit as exc:
        assert exc.code in (0, None), (path, exc.code)
    shown.append(" ".join(path))
print(json.dumps([shown, sorted(sys.modules)]))
"""


def helps(every: bool) -> tuple[list[str], set[str]]:
    """The commands whose ``--help`` a fresh interpreter printed (``reroll --help`` alone, or
    every command's too when `every`) and the modules it held after them."""
    code = PROBE.replace("EVERY", str(every))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    shown, loaded = json.loads(done.stdout.splitlines()[-1])
    return shown, set(loaded)


@pytest.mark.parametrize("every", [False, True], ids=["reroll --help", "every command's --help"])
def test_a_help_loads_no_command_implementation(every: bool) -> None:
    """``reroll --help``, and every ``reroll CMD --help`` after it, print their help without the
    docker SDK, aiohttp or any command's implementation."""
    shown, loaded = helps(every)
    assert "branch" in shown if every else shown == [""]
    assert "reroll.cli.branch" in loaded
    assert sorted(loaded & set(HEAVY)) == []
