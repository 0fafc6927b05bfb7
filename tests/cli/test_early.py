"""The console script's entry: a branch's shared proxy started before the CLI loads, on the loop
its command then runs on; the collector's thresholds raised."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest
import reroll.cli.app
import reroll.host.shared_process
from reroll.cli import early


@pytest.mark.parametrize(
    ("argv", "here"),
    [
        (["branch", "runs/a", "--model", "scripted:m.yaml", "--at", "3"], True),
        (["branch", "runs/a", "--model=openai/x", "--model", "scripted:m"], True),
        (["branch", "runs/a", "--model", "m", "--executor", "asyncio"], True),
        (["branch", "runs/a", "--model", "m", "--executor=ray"], False),
        (["branch", "runs/a", "--model", "m", "--help"], False),
        (["branch", "runs/a", "--at", "3"], False),
        (["run", "tasks/t", "--model", "m"], False),
        ([], False),
    ],
)
def test_branches_here_is_a_branch_whose_children_run_in_this_process(argv: list[str], here: bool) -> None:
    assert early.branches_here(argv) is here


def test_run_without_an_early_loop_runs_the_coroutine_on_a_loop_of_its_own() -> None:
    async def answer() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    first, second = early.run(answer()), early.run(answer())
    assert first is not second and first.is_closed() and second.is_closed()


def test_main_starts_a_branch_s_shared_proxy_first_on_the_loop_its_command_runs_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    thresholds: list[tuple[int, ...]] = []
    monkeypatch.setattr(gc, "set_threshold", lambda *values: thresholds.append(values))

    async def prestart() -> None:
        steps.append("prestart")
        loops.append(asyncio.get_running_loop())

    async def command() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def app() -> None:
        steps.append("command")
        loops.append(early.run(command()))

    monkeypatch.setattr(reroll.host.shared_process, "prestart_proxy", prestart)
    monkeypatch.setattr(reroll.cli.app, "app", app)
    monkeypatch.setattr(sys, "argv", ["reroll", "branch", "runs/a", "--model", "scripted:m.yaml"])
    early.main()
    assert steps == ["prestart", "command"] and thresholds == [early.GC_THRESHOLDS]
    assert loops[0] is loops[1] and loops[1].is_closed()
    assert early.run(command()) is not loops[1]  # the next command gets a loop of its own
