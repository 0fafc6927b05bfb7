"""Sandboxes started ahead of their rollouts (``reroll branch``: a child's sandbox starts while the
command still checks and plans), handed over to the rollout that then creates the same sandbox.

A command that knows which sandboxes its rollouts will make (the backend, the spec, the run id, the
settings) creates them and calls `start_ahead` on each; the rollout's own sandbox object, made
later by the lifecycle, calls `take_ahead` at its ``start``: it gets the one started ahead for its
run id (waiting for its start to end) when there is one, and adopts it only when the backend finds
it the same sandbox (its spec, settings and run id), else stops it and starts its own. `discard_ahead`
stops every one no rollout took (the command calls it when its rollouts are done, whatever
happened). What a backend started ahead carries the rollout's own labels (its run id), so a killed
command's leftovers are what ``reroll sandbox prune`` removes anyway.

Only sandboxes of this process and event loop are handed over (the ``asyncio`` executor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from reroll.sandbox.base import Sandbox

log = logging.getLogger(__name__)


@runtime_checkable
class StartsAhead(Protocol):
    """A sandbox that can be started ahead of its rollout (`start_ahead`)."""

    def start_ahead(self) -> bool:
        """Start now when this sandbox can be handed over (`take_ahead`); whether it was."""
        ...


_AHEAD: dict[str, tuple[Sandbox, asyncio.Task[None]]] = {}
"""Run id → the sandbox started ahead for it, and its start."""


def start_ahead(sandbox: Sandbox, run_id: str) -> None:
    """Start `sandbox` (created for the rollout of `run_id`) now, in a task of the running loop,
    for that rollout's sandbox to take (`take_ahead`); one started ahead before for `run_id` is
    left to `discard_ahead`. Must be called from a running event loop."""
    if run_id in _AHEAD:
        return
    _AHEAD[run_id] = (sandbox, asyncio.get_running_loop().create_task(sandbox.start()))


async def take_ahead(run_id: str, taker: Sandbox) -> Sandbox | None:
    """The sandbox started ahead for `run_id`, its start ended (removed from the registry: taken
    once), or None when there is none, it is `taker` itself (its own start, started ahead), or its
    start failed (it stopped itself then; the error is logged and the caller starts its own)."""
    entry = _AHEAD.get(run_id)
    if entry is None or entry[0] is taker:
        return None
    del _AHEAD[run_id]
    sandbox, started = entry
    try:
        await started
    except Exception as exc:  # the rollout starts its own sandbox, whose error it reports
        log.warning("the sandbox started ahead for %s failed: %s", run_id, exc)
        return None
    return sandbox


async def discard_ahead() -> None:
    """Stop every sandbox started ahead that no rollout took (their starts cancelled first).
    Raises only the caller's own cancellation."""
    entries = list(_AHEAD.values())
    _AHEAD.clear()
    for sandbox, started in entries:
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)
        with contextlib.suppress(Exception):
            await sandbox.stop()
