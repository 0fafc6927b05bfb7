"""The ``reroll`` console script's entry (`main`): a ``reroll branch`` starts the shared LLM proxy
and scripted model server its children join before it loads the command line.

Those two processes take about a second each to import and listen, and the command itself takes
as long to import the CLI, parse its flags and open the run folder: `main` spawns them first (on
the event loop the command then runs on, `run`, so that its rollouts find them started), then
imports the CLI (`reroll.cli.app`), so that their starts overlap all of the command's own work
rather than only its later part. The ``--model`` values are read from the raw arguments
(`branch_models`); the command reads them again from its flags and starts what is missing
(`reroll.models.spec.prestart_llm_side` finds these). A process started for nothing (a refused
command) stops with the loop, or dies with this process.

Importing this module loads nothing but the standard library.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_RUNNER: asyncio.Runner | None = None
"""The runner whose loop the shared processes were started on, when `main` started them."""


def branch_models(argv: Sequence[str]) -> list[str] | None:
    """The ``--model`` values of a ``reroll branch`` command line `argv` (without the program),
    when its children run in this process (no ``--executor`` other than ``asyncio``) and it asks
    for no help; None for any other command line.

    >>> branch_models(["branch", "run/x", "--model", "scripted:m.yaml", "--at=3"])
    ['scripted:m.yaml']
    """
    if not argv or argv[0] != "branch" or "--help" in argv:
        return None
    models, executor = [], "asyncio"
    for index, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if name == "--model":
            models.append(value)
        elif name == "--executor":
            executor = value
    return models if models and executor == "asyncio" else None


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on the loop `main` started the shared processes on, else on a new
    loop (uvloop when installed, else asyncio's), closed after it."""
    if _RUNNER is not None:
        return _RUNNER.run(coro)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def main() -> None:
    """Console-script entry point: the shared processes of a ``reroll branch`` (`branch_models`)
    spawned, then the command line (`reroll.cli.app.app`); the loop closed at the end (stopping
    processes no rollout joined)."""
    global _RUNNER
    models = branch_models(sys.argv[1:])
    if models is not None:
        _RUNNER = asyncio.Runner(loop_factory=_loop_factory())
        from reroll.models.spec import prestart_llm_side

        _RUNNER.run(prestart_llm_side(models))
    try:
        from reroll.cli.app import app

        app()
    finally:
        if _RUNNER is not None:
            _RUNNER.close()
            _RUNNER = None


def _loop_factory() -> Any:
    """uvloop's loop factory when uvloop is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop
