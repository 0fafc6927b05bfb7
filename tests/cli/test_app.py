"""The CLI's start: ``reroll --help`` and a command's help load no command's implementation (a
fresh interpreter's `sys.modules` after them), so the heavy imports cannot come back silently."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spawns  # a fresh interpreter each: the one running the tests has it all loaded

HEAVY = ("docker", "aiohttp", "aiohttp.web", "requests", "reroll.models.scripted", "reroll.jobs.branch")
"""What no help may load: the docker SDK, aiohttp (client or server), the scripted model server,
a command's implementation."""

PROBE = """
import json, sys
from reroll.cli.app import app
try:
    app({argv!r})
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (which prints them as JSON)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--help"], ["branch", "--help"], ["run", "--help"], ["job", "--help"]])
def test_a_help_loads_no_command_implementation(argv: list[str]) -> None:
    """``reroll --help`` and ``reroll CMD --help`` print their help without the docker SDK,
    aiohttp or any command's implementation."""
    loaded = loaded_after(PROBE.format(argv=argv))
    assert "reroll.cli.app" in loaded
    assert sorted(loaded & set(HEAVY)) == []
