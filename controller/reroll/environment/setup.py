"""A task's setup commands (``environment.setup_commands``, BenchFlow's ``sandbox.setup_commands``):
shell lines run in the sandbox, in order, once its services are ready and before the agent
starts, to seed the workspace or a database the task's image does not carry. Each runs with
``sh -c`` as the sandbox's own user (or its ``user``), in its ``cwd`` (default: the sandbox's
working folder), with the sandbox's environment, the services' and its own ``env`` (host
templates resolved as in ``environment.env``); its output goes to ``services/setup.log`` in the
run folder. Commands naming the same ``host_lock`` run one at a time on this host, across
rollouts and processes (a file lock in reroll's cache). One that exits non-zero, or outlives its
``timeout_sec``, ends the rollout as ``environment_error`` naming it, with its output's end;
nothing else of the rollout is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from reroll_contracts.errors import TaskEnvironmentError
from rich.console import Console

from reroll.cache import cache_dir
from reroll.runfolder.paths import SETUP_LOG, RunPaths
from reroll.runfolder.run import SERVICES_DIR
from reroll.sandbox.base import Sandbox
from reroll.tasks.compat import resolve_env
from reroll.tasks.environment import SetupCommand

OUTPUT_TAIL_CHARS = 2000
"""How much of a failed command's output its error quotes."""


async def run_setup_commands(
    sandbox: Sandbox,
    commands: list[SetupCommand],
    env: Mapping[str, str],
    run_dir: Path,
    console: Console,
) -> None:
    """Run `commands` in `sandbox` one after the other (see the module docstring).

    Args:
        env: the environment of the sandbox's processes (the base and the task's), each
            command's own ``env`` over it.

    Raises:
        TaskEnvironmentError: a command exited non-zero or ran out of time (its index, its line,
            its exit and its output's end named).
        TaskError: a command's ``env`` asks for a host variable that is not set.
    """
    if not commands:
        return
    RunPaths(run_dir).services.mkdir(exist_ok=True)
    for index, setup in enumerate(commands):
        console.print(f"[dim]setup command {index + 1}/{len(commands)}: {setup.command}[/dim]")
        await _run_one(sandbox, index, setup, env, RunPaths(run_dir).setup_log, console)


async def _run_one(
    sandbox: Sandbox, index: int, setup: SetupCommand, env: Mapping[str, str], log: Path, console: Console
) -> None:
    """Run the setup command number `index` (see `run_setup_commands`), its output appended to `log`."""
    field = f"environment.setup_commands[{index}]"
    if setup.capture_dir is not None:
        console.print(f"[yellow]{field}.capture_dir {setup.capture_dir}: not captured[/yellow]")
    async with _host_lock(setup.host_lock):
        result = await sandbox.exec(
            ["sh", "-c", setup.command],
            cwd=setup.cwd or sandbox.layout.workspace,
            env={**env, **resolve_env(setup.env, os.environ, f"{field}.env")},
            inherit_env=False,
            user="" if setup.user is None else str(setup.user),
            timeout_seconds=setup.timeout_sec,
        )
    output = result.output_text()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"# [{index}] {setup.command} → exit {result.exit_code}\n{output}\n")
    if result.exit_code == 0:
        return
    ended = f"exited {result.exit_code}"
    if result.timed_out:
        ended = f"ran out of its {setup.timeout_sec:g} s"
    raise TaskEnvironmentError(
        f"{field} `{setup.command}` {ended} (see {SERVICES_DIR}/{SETUP_LOG}):\n"
        f"{output[-OUTPUT_TAIL_CHARS:] or '(no output)'}"
    )


@contextlib.asynccontextmanager
async def _host_lock(name: str | None) -> AsyncIterator[None]:
    """Hold the host-wide lock `name` (a file lock under reroll's cache, taken in a thread so the
    event loop runs on while another rollout holds it); nothing when `name` is None."""
    if name is None:
        yield
        return
    path = cache_dir() / "setup-locks" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
