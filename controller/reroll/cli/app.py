"""The ``reroll`` command line (typer): the app, its command groups, and `main`.

Each command lives in a module named after what a user types (`reroll.cli.run`,
`reroll.cli.continue_` for ``continue`` and ``continue-job``, `reroll.cli.replay`,
`reroll.cli.branch`, `reroll.cli.job`, `reroll.cli.export`, `reroll.cli.view`, `reroll.cli.agents`,
`reroll.cli.model`, `reroll.cli.sandbox`, `reroll.cli.store`, `reroll.cli.task`) as a plain
function; this module registers them, in the order ``reroll --help`` lists them. What they share
(options, consoles, exit codes) is `reroll.cli.common`.

Exit codes: 0 the rollout ran (status ``ok`` or ``timeout``); 1 it ended with status ``error``
(agent crash, strict divergence, verifier failure) — for ``replay``: the rebuild is not
faithful; for ``branch``, ``job``, ``continue-job``: a rollout ended in error — or the command
failed on something other than its input (Docker or Ray unreachable); 2 bad input (a
`reroll_contracts.errors.ConfigError`: missing task, unknown agent or sandbox backend, missing provider
key, corrupt run folder, ``--at`` out of range …, a flag the command does not take), reported
before anything is written.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
import typer.core
from typer import _click  # typer's own copy of click: the types TyperGroup's methods take

from reroll import __version__
from reroll.cli import (
    agents,
    branch,
    continue_,
    export,
    job,
    model,
    replay,
    rescore,
    run,
    sandbox,
    store,
    task,
    view,
)
from reroll.cli.common import console


# Help and usage errors as click renders them (rich_markup_mode=None), not as rich panels: rich's
# option table cuts option names to fit (`--no-require-ti…` at 80 columns, the width of any pipe or
# CI log) and reads the `[default: …]` of help texts as markup; click wraps help texts and prints
# every option name whole.
class PlainHelpGroup(typer.core.TyperGroup):
    """A command group whose help lists each command with its whole first sentence, wrapped
    (click would cut it to the width, ending it with ``...``)."""

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        rows = [
            (name, command.get_short_help_str(limit=sys.maxsize))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _group(help_text: str) -> typer.Typer:
    """A sub-command group of ``reroll``, rendered like the app."""
    return typer.Typer(help=help_text, no_args_is_help=True, cls=PlainHelpGroup, rich_markup_mode=None)


app = typer.Typer(
    help="reroll: run LLM agents in sandboxes, record every LLM exchange, replay and continue runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainHelpGroup,
    rich_markup_mode=None,
)
app.command("run")(run.run)
app.command("continue")(continue_.continue_)
app.command("continue-job")(continue_.continue_job)
app.command("replay")(replay.replay)
app.command("rescore")(rescore.rescore)
app.command("branch")(branch.branch)
app.command("job")(job.job)
app.command("agents")(agents.agents)
app.command("export")(export.export)
app.command("view")(view.view)

model_app = _group("The bundled scripted model server.")
model_app.command("serve")(model.model_serve)
app.add_typer(model_app, name="model")
sandbox_app = _group("Sandbox housekeeping.")
sandbox_app.command("prune")(sandbox.sandbox_prune)
app.add_typer(sandbox_app, name="sandbox")
task_app = _group("Task folders.")
task_app.command("check")(task.task_check)
app.add_typer(task_app, name="task")
store_app = _group("A sequential-shared job's learner store: its generations, diffs, rollback.")
store_app.command("log")(store.store_log)
store_app.command("diff")(store.store_diff)
store_app.command("rollback")(store.store_rollback)
app.add_typer(store_app, name="store")


def _version(value: bool) -> None:
    if value:
        console.print(f"reroll {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """reroll: run LLM agents in sandboxes, record every LLM exchange, replay and continue runs."""
    _show_image_builds()


def _show_image_builds() -> None:
    """Print the steps of image builds (minutes on first use of ``--sandbox docker``) on stderr."""
    images_logger = logging.getLogger("reroll.sandbox.docker.images")  # not imported: it loads the docker SDK
    if not images_logger.handlers:
        handler = logging.StreamHandler()  # stderr, one unwrapped line per step
        handler.setFormatter(logging.Formatter("%(asctime)s building images: %(message)s", "%H:%M:%S"))
        images_logger.addHandler(handler)
        images_logger.setLevel(logging.INFO)


def main() -> None:
    """The console script of an install made before its entry moved to `reroll.cli.early.main`
    (``make env`` installs the new one): the command line, without the early start."""
    app()
