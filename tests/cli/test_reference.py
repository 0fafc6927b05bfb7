"""The site's command-line reference is what ``reroll … --help`` prints (`reroll.cli.reference`)."""

from __future__ import annotations

import pytest
from reroll.cli.app import app
from reroll.cli.reference import WIDTH_COLUMNS, CommandHelp, command_helps, reference_markdown
from typer.testing import CliRunner

HELPS = command_helps()
PAGE = reference_markdown()


def test_every_command_of_the_app_is_in_the_reference() -> None:
    lines = {entry.command_line for entry in HELPS}
    assert {"reroll", "reroll run", "reroll continue", "reroll continue-job", "reroll branch"} <= lines
    assert {"reroll model", "reroll model serve", "reroll store rollback", "reroll task check"} <= lines
    top = HELPS[0].help_text.split("Commands:", 1)[1]
    listed = {line.split()[0] for line in top.splitlines() if line.startswith("  ") and line[2] != " "}
    assert listed == {entry.words[1] for entry in HELPS if len(entry.words) == 2}


@pytest.mark.parametrize("entry", HELPS, ids=lambda entry: entry.command_line)
def test_each_section_is_the_commands_own_help(entry: CommandHelp) -> None:
    printed = CliRunner().invoke(
        app, [*entry.words[1:], "--help"], terminal_width=WIDTH_COLUMNS, prog_name="reroll"
    )
    assert printed.exit_code == 0, printed.output
    assert printed.output.rstrip("\n") == entry.help_text
    assert f"## `{entry.command_line}`\n\n```text\n{entry.help_text}\n```\n" in PAGE
