"""The ``reroll`` console script's entry (`main`): a ``reroll branch`` starts the shared LLM proxy
its children join (the scripted model's server too) before it loads the command line.

That process takes about a second to import and listen, and the command itself takes as long to
import the CLI, parse its flags and open the run folder: `main` spawns it first (on the event
loop the command then runs on, `run`, so that its rollouts find it started), then imports the CLI
(`reroll.cli.app`), so that its start overlaps all of the command's own work rather than only its
later part. Whether the command runs its branches here is read from the raw arguments
(`branches_here`); the command starts the proxy again where this did not
(`reroll.host.shared_process.prestart_proxy` finds it started). A process started for nothing (a
refused command) stops with the loop, or dies with this process. The command runs with the
garbage collector's thresholds raised (`GC_THRESHOLDS`).

Importing this module loads nothing but the standard library.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

GC_THRESHOLDS = (20_000, 50, 100)
"""The collector's thresholds in a ``reroll`` command (CPython's: 700, 10, 10). A command's start
allocates about 115,000 tracked objects that live as long as it (the classes, functions and
models of its 700-odd modules), which the default thresholds traverse again and again while they
load: about a tenth of a ``reroll branch``'s import CPU time (0.05 CPU-s), on its fork's path.
The same collector, run less often."""

_RUNNER: asyncio.Runner | None = None
"""The runner whose loop the shared proxy was started on, when `main` started it."""


def branches_here(argv: Sequence[str]) -> bool:
    """Whether the command line `argv` (without the program) is a ``reroll branch`` with a
    ``--model`` whose children run in this process (no ``--executor`` other than ``asyncio``)
    and that asks for no help.

    >>> branches_here(["branch", "run/x", "--model", "scripted:m.yaml", "--at=3"])
    True
    """
    if not argv or argv[0] != "branch" or "--help" in argv:
        return False
    models, executor = False, "asyncio"
    for index, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if not equals:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if name == "--model":
            models = True
        elif name == "--executor":
            executor = value
    return models and executor == "asyncio"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end on the loop `main` started the shared proxy on, else on a new
    loop (uvloop when installed, else asyncio's), closed after it."""
    if _RUNNER is not None:
        return _RUNNER.run(coro)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coro)


def main() -> None:
    """Console-script entry point: the shared proxy of a ``reroll branch`` (`branches_here`)
    spawned, then the command line (`reroll.cli.app.app`); the loop closed at the end (stopping
    a proxy no rollout joined)."""
    global _RUNNER
    gc.set_threshold(*GC_THRESHOLDS)
    if branches_here(sys.argv[1:]):
        _RUNNER = asyncio.Runner(loop_factory=_loop_factory())
        from reroll.host.shared_process import prestart_proxy

        _RUNNER.run(prestart_proxy())
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
