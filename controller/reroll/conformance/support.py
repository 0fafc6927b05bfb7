"""What the conformance checks share: the failure type, expectations, the probe task, helpers."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path

from reroll.rollout.lifecycle import sandbox_env
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.base import Sandbox, SandboxFactory
from reroll.tasks.task import Task, load_task

Check = Callable[[SandboxFactory, Path], Awaitable[None]]
"""One conformance check: ``await check(factory, workdir)`` raises ConformanceError on failure."""


class ConformanceError(AssertionError):
    """A backend broke the `Sandbox` contract; the message says which promise and what was seen."""


def expect(condition: bool, message: str) -> None:
    """Raise ConformanceError(`message`) unless `condition` holds."""
    if not condition:
        raise ConformanceError(message)


@contextlib.contextmanager
def expect_raises(error: type[BaseException], pattern: str) -> Iterator[None]:
    """The block must raise `error` with a message matching the regular expression `pattern`.

    Raises:
        ConformanceError: nothing was raised, or the message does not match.
    """
    try:
        yield
    except error as exc:
        expect(
            re.search(pattern, str(exc)) is not None,
            f"{type(exc).__name__} {exc!r} does not match {pattern!r}",
        )
    else:
        raise ConformanceError(f"expected {error.__name__} matching {pattern!r}; nothing was raised")


HELLO_TEST_SH = """#!/bin/sh
# reward 1 when the workspace's hello.txt reads "Hello, reroll!", else 0.
reward=0
[ "$(cat "${REROLL_WORKSPACE:-/app}/hello.txt" 2>/dev/null)" = "Hello, reroll!" ] && reward=1
echo $reward > "${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
"""

ENV_TEST_SH = """#!/bin/sh
# Prints who runs it and its environment; reward 1.
echo "user=$(id -un)"
env
echo 1 > "${REROLL_LOGS_DIR:-/logs}/verifier/reward.txt"
"""

SEED_FILE = "README.txt"
"""The file the probe task's ``environment/workspace/`` seeds the workspace with."""


def probe_task(
    root: Path, test_sh: str = HELLO_TEST_SH, verifier: Mapping[str, object] | None = None
) -> Task:
    """Write a task into the empty host folder `root` and load it.

    Args:
        root: where the task is written (created).
        test_sh: its verifier's ``test.sh``; default: reward 1 when the workspace's ``hello.txt``
            reads ``Hello, reroll!``.
        verifier: the task's ``verifier`` section beyond ``timeout_sec: 30``.
    """
    front = {"name": "probe", "verifier": {"timeout_sec": 30, **(verifier or {})}}
    (root / "verifier").mkdir(parents=True)
    (root / "environment" / "workspace").mkdir(parents=True)
    (root / "environment" / "workspace" / SEED_FILE).write_text("the probe task's workspace\n")
    (root / "task.md").write_text(f"---\n{json.dumps(front)}\n---\nCreate hello.txt.\n")
    (root / "verifier" / "test.sh").write_text(test_sh)
    return load_task(root)


@contextlib.asynccontextmanager
async def started(factory: SandboxFactory, task: Task, run_id: str = "") -> AsyncIterator[Sandbox]:
    """A sandbox of `factory` for `task` (its `reroll.rollout.sandbox_spec.sandbox_spec`), started
    with ``async with``, stopped on leaving."""
    async with factory(sandbox_spec(task), run_id or f"conformance-{uuid.uuid4().hex[:8]}") as sandbox:
        yield sandbox


async def sh(sandbox: Sandbox, script: str, *, user: str = "", env: Mapping[str, str] | None = None) -> str:
    """Run `script` with sh in the workspace and return its stdout.

    Raises:
        ConformanceError: it exited non-zero (the message holds its output).
    """
    result = await sandbox.exec(["sh", "-c", script], cwd=sandbox.layout.workspace, user=user, env=env)
    expect(result.exit_code == 0, f"{script!r} exited {result.exit_code}: {result.output_text()}")
    return result.stdout.decode()


def base_env(sandbox: Sandbox) -> dict[str, str]:
    """The base environment rollouts give processes in `sandbox` (`reroll.rollout.lifecycle.sandbox_env`)."""
    return sandbox_env(sandbox)


ALIVE_SCRIPT = """
for _ in $(seq 50); do
  state=$(cut -d' ' -f3 /proc/$(cat bg.pid)/stat 2>/dev/null)
  if [ -z "$state" ] || [ "$state" = Z ]; then exit 1; fi
  sleep 0.1
done
"""
"""Exits 0 while the process in the workspace's bg.pid still runs after 5 s, 1 once it is gone
or a zombie (killed all the same, only not yet reaped)."""

BACKGROUND_SLEEP = "nohup sleep 300 >/dev/null 2>&1 & echo $! > bg.pid"
"""Starts a process that outlives its command, its pid in the workspace's bg.pid."""


async def expect_gone(sandbox: Sandbox, what: str) -> None:
    """The process in the workspace's bg.pid must be gone; `what` names it in the failure."""
    alive = await sandbox.exec(["sh", "-c", ALIVE_SCRIPT], cwd=sandbox.layout.workspace)
    expect(alive.exit_code != 0, f"{what} still runs")
