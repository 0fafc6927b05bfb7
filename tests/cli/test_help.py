"""``--help`` of every command and subcommand, rendered at 80 columns without a terminal (as in a
pipe or a CI log): every option's whole name is there, and every line fits."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
import typer.core
import typer.main
from reroll.cli.app import app
from typer import _click
from typer.testing import CliRunner

WIDTH = 80


def commands(
    command: _click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], _click.Command]]:
    """`command` and everything below it, each with the arguments that name it."""
    yield path, command
    if isinstance(command, typer.core.TyperGroup):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(p) or "reroll" for p, _ in ALL])
def test_help_names_every_option_whole_at_80_columns(path: tuple[str, ...], command: _click.Command) -> None:
    done = CliRunner().invoke(app, [*path, "--help"], terminal_width=WIDTH, env={"COLUMNS": str(WIDTH)})
    assert done.exit_code == 0, done.output
    help_text = done.output
    names = [name for param in command.params for name in (*param.opts, *param.secondary_opts)]
    names = [name for name in names if name.startswith("-")]
    missing = [name for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", help_text)]
    assert not missing, f"options missing or cut in `reroll {' '.join(path)} --help`:\n{help_text}"
    assert "…" not in help_text
    too_wide = [line for line in help_text.splitlines() if len(line) > WIDTH]
    assert not too_wide, f"lines wider than {WIDTH} columns:\n" + "\n".join(too_wide)
    if isinstance(command, typer.core.TyperGroup):
        for name, sub in command.commands.items():
            summary = flat(sub.get_short_help_str(limit=sys.maxsize))
            assert f"{name} {summary}" in flat(help_text), f"{name}'s summary is cut:\n{help_text}"


def test_every_command_is_checked() -> None:
    """The walk reaches the subcommands of subcommand groups (here: ``model serve``)."""
    paths = {" ".join(path) for path, _ in ALL}
    assert {"", "run", "continue", "branch", "job", "model serve", "sandbox prune", "store rollback"} <= paths


@pytest.mark.spawns  # a fresh interpreter: the import order is its own
def test_the_command_modules_import_in_any_order_and_register_once() -> None:
    """Each command module is a plain module (no registration on import): importing one before
    the app changes neither the commands nor their order in ``reroll --help``."""
    code = (
        "import reroll.cli.job, reroll.cli.sandbox, reroll.cli.run\n"
        "import typer.main\nfrom reroll.cli.app import app\n"
        "print(' '.join(typer.main.get_command(app).commands))"
    )
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [
        *("run", "continue", "continue-job", "replay", "rescore", "branch", "job", "agents", "export"),
        *("view", "model", "sandbox", "task", "store"),
    ]
