"""A sandbox backend for the job tests: the real `local` backend, whose first starts fail.

Registered in `reroll.sandbox.base.BACKENDS` by the tests (monkeypatch) as ``flaky``; the number
of starts still to fail is in `FAILURES_LEFT`.
"""

from __future__ import annotations

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
