"""The command-line reference of the documentation site, generated from the typer app.

Each entry is the text ``reroll … --help`` prints, rendered by the same click formatter at a fixed
width, so the site's ``cli.md`` (written at build time by ``docs/hooks/cli_reference.py``) and
the command line cannot disagree: nothing of the reference is written by hand.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from typer import _click  # typer's own copy of click: the types its commands are made of
from typer.core import TyperGroup
from typer.main import get_command

from reroll.cli.app import app

WIDTH_COLUMNS = 80
"""The width the reference is rendered at, in columns (click's own cap for help text)."""


class CommandHelp(BaseModel):
    """One command (or command group) of ``reroll`` and its help text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    words: tuple[str, ...]
    """What a user types before ``--help``, ``reroll`` included: ``("reroll", "model", "serve")``."""
    help_text: str
    """What ``reroll … --help`` prints at `WIDTH_COLUMNS` columns, without the last newline."""

    @property
    def command_line(self) -> str:
        """The command as typed, e.g. ``reroll model serve``."""
        return " ".join(self.words)


def command_helps(width_columns: int = WIDTH_COLUMNS) -> list[CommandHelp]:
    """Every visible command of ``reroll`` with its help, depth first in ``reroll --help``'s order.

    Args:
        width_columns: The terminal width to render at, in columns.

    Returns:
        The root first, then each command; a group is followed by its own commands.
    """
    root = get_command(app)
    context = _click.Context(root, info_name="reroll", terminal_width=width_columns)
    return list(_walk(root, context, ("reroll",)))


def _walk(command: _click.Command, context: _click.Context, words: tuple[str, ...]) -> list[CommandHelp]:
    found = [CommandHelp(words=words, help_text=command.get_help(context).rstrip("\n"))]
    if isinstance(command, TyperGroup):
        for name in command.list_commands(context):
            child = command.get_command(context, name)
            if child is not None and not child.hidden:
                child_context = _click.Context(child, info_name=name, parent=context)
                found += _walk(child, child_context, (*words, name))
    return found


def reference_markdown(width_columns: int = WIDTH_COLUMNS) -> str:
    """The site's command-line reference page: one section per command, its ``--help`` verbatim.

    Args:
        width_columns: The terminal width to render the help texts at, in columns.

    Returns:
        The page's Markdown text.
    """
    parts = [
        "# Command-line reference\n",
        "Generated when the site is built, from the same typer app that `reroll` runs: each section is "
        f"what `… --help` prints at {width_columns} columns. Exit codes and the flags shared by several "
        "commands are explained in [Commands and shared flags](usage.md).\n",
    ]
    for entry in command_helps(width_columns):
        parts.append(f"## `{entry.command_line}`\n\n```text\n{entry.help_text}\n```\n")
    return "\n".join(parts)
