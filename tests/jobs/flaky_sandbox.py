"""Sandbox backends for the job tests: the real `local` backend, whose first starts fail
(``flaky``), whose overlapping starts are counted (``counting``), or whose start has a bug
(``broken``: an exception outside reroll's tree).

Registered in `reroll.sandbox.base.BACKENDS` by the tests (monkeypatch); the number of starts
still to fail is in `FAILURES_LEFT`, the overlap counts in `STARTING`.
"""

from __future__ import annotations

import asyncio

from reroll.sandbox.local.plain import LocalSandbox
from reroll_contracts.errors import SandboxError

FAILURES_LEFT = {"starts": 0}


class FlakySandbox(LocalSandbox):
    """`LocalSandbox` that raises SandboxError from `start` while ``FAILURES_LEFT["starts"]`` > 0."""

    async def start(self) -> None:
        if FAILURES_LEFT["starts"] > 0:
            FAILURES_LEFT["starts"] -= 1
            raise SandboxError(f"flaky sandbox {self.root}: injected start failure")
        await super().start()


STARTING = {"now": 0, "peak": 0, "overlap": 1, "begun": 0}
"""Starts under way now, the most at once so far, how many a start waits to see at once, and how
many have begun."""
OVERLAP_WAIT_SECONDS = 60.0
"""How long a start waits for ``STARTING["overlap"]`` starts at once before it fails."""


class CountingSandbox(LocalSandbox):
    """`LocalSandbox` that records in `STARTING` how many starts overlap (the peak).

    Each start but the first (a job's first rollout starts alone,
    `reroll.jobs.executors.HeadStartGate`) first waits until ``STARTING["overlap"]`` starts are
    under way at once, so an expected overlap shows however slowly the rollouts reach their starts,
    and a start gate that lets fewer through fails the start instead of racing a timer.
    """

    async def start(self) -> None:
        STARTING["now"] += 1
        STARTING["begun"] += 1
        STARTING["peak"] = max(STARTING["peak"], STARTING["now"])
        try:
            async with asyncio.timeout(OVERLAP_WAIT_SECONDS):
                while STARTING["begun"] > 1 and STARTING["peak"] < STARTING["overlap"]:
                    await asyncio.sleep(0.01)
            await super().start()
        finally:
            STARTING["now"] -= 1


class BrokenSandbox(LocalSandbox):
    """`LocalSandbox` whose `start` raises a RuntimeError, as a bug in a backend would."""

    async def start(self) -> None:
        raise RuntimeError(f"broken sandbox {self.root}: a bug in start")
