"""Sandbox backends for the job tests: the real `local` backend, whose first starts fail
(``flaky``), or whose overlapping starts are counted (``counting``).

Registered in `reroll.sandbox.base.BACKENDS` by the tests (monkeypatch); the number of starts
still to fail is in `FAILURES_LEFT`, the overlap counts in `STARTING`.
"""

from __future__ import annotations

import asyncio

from reroll.errors import SandboxError
from reroll.sandbox.local import LocalSandbox

FAILURES_LEFT = {"starts": 0}


class FlakySandbox(LocalSandbox):
    """`LocalSandbox` that raises SandboxError from `start` while ``FAILURES_LEFT["starts"]`` > 0."""

    async def start(self) -> None:
        if FAILURES_LEFT["starts"] > 0:
            FAILURES_LEFT["starts"] -= 1
            raise SandboxError(f"flaky sandbox {self.root}: injected start failure")
        await super().start()


STARTING = {"now": 0, "peak": 0}


class CountingSandbox(LocalSandbox):
    """`LocalSandbox` that records in `STARTING` how many starts overlap (the peak)."""

    async def start(self) -> None:
        STARTING["now"] += 1
        STARTING["peak"] = max(STARTING["peak"], STARTING["now"])
        try:
            await asyncio.sleep(0.3)  # widen the start-up phase, so overlaps show
            await super().start()
        finally:
            STARTING["now"] -= 1
