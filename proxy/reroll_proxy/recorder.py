"""Durable, ordered appends of exchanges to ``llm_trajectory.jsonl``.

The guarantees, for each exchange's line (orjson, ``\\n``-terminated):

- when `Recorder.record` returns, the line has been written to the OS (one ``write`` on a
  file opened ``O_APPEND``, no buffer of our own), so it survives the proxy dying right after
  (SIGKILL included);
- its ``fsync`` then runs in the recorder's own thread (`_Syncer`: a queue and one thread, not
  the loop's executor, whose hand-over costs more than the rest of the recording), handed over
  on the event loop's next turn (so after the response went out: waking a thread is itself a
  cost the agent need not wait for),
  and completes before the next line is written and before `Recorder.aclose` returns. So the
  file on disk is always a whole-line prefix of the run (a machine crash can lose at most the
  exchange whose fsync was in flight, together with the sandbox that was acting on it; a torn
  last line is ignored by `reroll_contracts.trajectory.load_trajectory`). Overlapping the fsync
  with the response keeps the disk off the exchange's latency (``scripts/bench/proxy.py``).

The server calls `record` before the agent can see the end of the response it records:

- non-streamed responses: before the first byte of the response is sent;
- streamed responses: after the upstream stream ended and every event but the closing
  ``data: [DONE]`` was forwarded, before ``[DONE]`` is sent and the response is closed. An
  agent that reads to the end of the stream (every SDK does) therefore never acts on a
  response that is not in the file; one that acts on partial chunks may be ahead of the file
  by that one response.

Lines are appended in step order even when requests overlap: `record` for step k waits until
steps 0..k-1 were recorded or skipped (`skip`, for a step that ends without an exchange, e.g.
because the agent hung up).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from pathlib import Path

from reroll_contracts.trajectory import Exchange


class Recorder:
    """Appends exchanges to a JSONL file, durably and in step order.

    Args:
        path: the trajectory file; created (with its folder) if missing, appended to otherwise.
        first_step: the step of the first exchange this recorder will write.
        fsync: ``fsync`` every line (default, overlapped with the response); False only
            flushes it to the OS.
    """

    def __init__(self, path: Path, first_step: int = 0, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._next_step = first_step
        self._done: set[int] = set()
        self._turn = asyncio.Condition()
        self._fd: int | None = None
        """The trajectory, opened for appending (unbuffered)."""
        self._syncing: asyncio.Future[None] | None = None
        self._syncer: _Syncer | None = None

    def open(self) -> None:
        """Open (create) the file now, so a path that cannot be written fails early.

        Raises:
            OSError: the file or its folder cannot be created.
        """
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            _fsync_dir(self.path.parent)

    async def record(self, step: int, exchange: Exchange, *, request_json: bytes | None = None) -> None:
        """Append `exchange` as the line of `step`, once every earlier step is done.

        Args:
            step: the exchange's step (its ``metadata.step``).
            exchange: what to write.
            request_json: ``exchange.request.line_json()``, if made ahead (`Exchange.to_line`).

        Raises:
            OSError: the write failed, or the previous line's fsync did.
        """
        async with self._turn:
            await self._turn.wait_for(lambda: self._next_step == step)
            await self._synced()
            self.open()
            assert self._fd is not None
            _write_all(self._fd, exchange.to_line(request_json))
            if self._fsync:
                syncing = self._syncing = asyncio.get_running_loop().create_future()
                self._syncer = self._syncer or _Syncer()
                syncing.get_loop().call_soon(self._syncer.fsync, self._fd, syncing)
            self._advance(step)

    async def _synced(self) -> None:
        """Wait for the fsync in flight, if any (raising its OSError)."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            await syncing

    async def skip(self, step: int) -> None:
        """Mark `step` as done without a line (no-op if it was recorded already)."""
        async with self._turn:
            if step >= self._next_step:
                self._advance(step)

    def _advance(self, step: int) -> None:
        self._done.add(step)
        while self._next_step in self._done:
            self._done.discard(self._next_step)
            self._next_step += 1
        self._turn.notify_all()

    async def aclose(self) -> None:
        """Wait for the last line's fsync, then close the file (recording again reopens it).

        Raises:
            OSError: that fsync failed (the file is closed all the same).
        """
        try:
            await self._synced()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            syncer, self._syncer = self._syncer, None
            if syncer is not None:
                syncer.stop()


class _Syncer:
    """One thread that runs the ``fsync`` calls it is handed, in order, each outcome set on its
    future through the future's loop; started at once, ended by `stop` (it then exits as soon as
    the calls handed over before are done)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[int, asyncio.Future[None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="reroll-fsync", daemon=True)
        self._thread.start()

    def fsync(self, fd: int, syncing: asyncio.Future[None]) -> None:
        """Run ``fsync(fd)`` in the thread; its outcome becomes `syncing`'s (unless it is cancelled)."""
        self._calls.put((fd, syncing))

    def stop(self) -> None:
        """Let the thread end once the calls handed over so far are done."""
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            fd, syncing = call
            error = None
            try:
                os.fsync(fd)
            except OSError as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits for it
                syncing.get_loop().call_soon_threadsafe(_settle, syncing, error)


def _settle(syncing: asyncio.Future[None], error: OSError | None) -> None:
    """Give `syncing` its fsync's outcome (on its loop), unless whoever waited for it is gone."""
    if syncing.done():
        return
    if error is None:
        syncing.set_result(None)
    else:
        syncing.set_exception(error)


def _write_all(fd: int, line: bytes) -> None:
    """Write `line` to `fd`: one ``write`` (a regular file takes it whole; the loop is for the
    short write a full disk or a signal could cause)."""
    view = memoryview(line)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(folder: Path) -> None:
    """Make a newly created file's directory entry durable (best effort: not on every OS)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
