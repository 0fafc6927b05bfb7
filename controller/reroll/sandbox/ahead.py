"""Sandboxes started ahead of their rollouts (``reroll branch``: a child's sandbox starts while the
command still checks and plans), handed over to the rollout that then creates the same sandbox.

A command that knows which sandboxes its rollouts will make (the backend, the spec, the run id, the
settings) creates them and calls `start_ahead` on each; the rollout's own sandbox object, made
later by the lifecycle, calls `take_ahead` at its ``start``: it gets the one started ahead for its
run id (waiting for its start to end) when there is one, and adopts it only when the backend finds
it the same sandbox (its spec, settings and run id), else stops it and starts its own. `discard_ahead`
stops every one no rollout took (the command calls it when its rollouts are done, whatever
happened). The first of a batch started ahead leads: a backend runs its costly launch (docker's
container create and start) in `lead_first`, where the others' launches wait for the lead's to end,
so the first sandbox (the first child's first request: the fork latency) does not share the engine
and the CPUs with them; they then launch together. What a backend started ahead carries the
rollout's own labels (its run id), so a killed command's leftovers are what ``reroll sandbox
prune`` removes anyway.

Only sandboxes of this process and event loop are handed over (the ``asyncio`` executor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
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


LEAD_WAIT_SECONDS = 10.0
"""At most this long a launch waits for its lead's (`lead_first`)."""


@dataclass
class _Batch:
    """The sandboxes started ahead while the lead's launch has not ended."""

    lead: str
    """The lead's run id."""
    launched: threading.Event = field(default_factory=threading.Event)
    """Set once the lead's launch (or its whole start) ended, however."""


_AHEAD: dict[str, tuple[Sandbox, asyncio.Task[None]]] = {}
"""Run id → the sandbox started ahead for it, and its start."""
_BATCHES: dict[str, _Batch] = {}
"""Run id of a sandbox started ahead whose launch has not begun → its batch."""
_batch: _Batch | None = None
"""The latest batch (a new one begins once its lead launched)."""


def start_ahead(sandbox: Sandbox, run_id: str) -> None:
    """Start `sandbox` (created for the rollout of `run_id`) now, in a task of the running loop,
    for that rollout's sandbox to take (`take_ahead`); one started ahead before for `run_id` is
    left to `discard_ahead`. Must be called from a running event loop."""
    global _batch
    if run_id in _AHEAD:
        return
    if _batch is None or _batch.launched.is_set():
        _batch = _Batch(run_id)
    _BATCHES[run_id] = batch = _batch
    started = asyncio.get_running_loop().create_task(sandbox.start())
    if batch.lead == run_id:  # its start ended before its launch: the others launch anyway
        started.add_done_callback(lambda _: batch.launched.set())
    _AHEAD[run_id] = (sandbox, started)


@contextlib.contextmanager
def lead_first(run_id: str) -> Iterator[None]:
    """Around a sandbox's launch (blocking: called in a worker thread): when `run_id`'s sandbox
    was started ahead but does not lead its batch, first wait (at most `LEAD_WAIT_SECONDS`) for
    the lead's launch to end; the lead's end lets the others go, whether it raised or not."""
    batch = _BATCHES.pop(run_id, None)
    if batch is not None and batch.lead != run_id:
        batch.launched.wait(LEAD_WAIT_SECONDS)
    try:
        yield
    finally:
        if batch is not None and batch.lead == run_id:
            batch.launched.set()


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
    global _batch
    entries = list(_AHEAD.values())
    _AHEAD.clear()
    for batch in [*_BATCHES.values(), *([_batch] if _batch is not None else [])]:
        batch.launched.set()
    _BATCHES.clear()
    _batch = None  # the next command's first sandbox leads a batch of its own
    for sandbox, started in entries:
        started.cancel()
        await asyncio.gather(started, return_exceptions=True)
        with contextlib.suppress(Exception):
            await sandbox.stop()
