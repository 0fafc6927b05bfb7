"""The run folder's agent log, ``agent/output.log``: every turn's stdout and stderr, capped.

The controller streams the agent's output into it as it arrives (`AgentLog`) and keeps only a
short tail in memory (`reroll.sandbox.results.STREAMED_TAIL_BYTES`). The log holds at most
`AGENT_LOG_MAX_BYTES` of output over all the turns of a rollout; a turn whose output did not fit
ends the log with one note line, starting with `CUT_NOTE` and saying how many bytes of that turn
were dropped (one line; wrapped here)::

    [reroll] agent output cut: agent/output.log keeps the first 67108864 bytes;
    1006632960 more bytes of this turn were dropped

That note is the flag: a log without it holds every byte the agent wrote.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Self

from reroll.runfolder.run import AGENT_LOG

__all__ = ["AGENT_LOG", "AGENT_LOG_MAX_BYTES", "AgentLog"]
AGENT_LOG_MAX_BYTES = 64 * 1024 * 1024
"""The most of the agent's output the log holds, in bytes (64 MiB), note lines not counted."""
CUT_NOTE = "[reroll] agent output cut:"
"""How the note line of a cut log starts."""


class AgentLog:
    """Appends one turn's output to the agent log, up to `limit` bytes in the file, then drops it.

    Use as a context manager: leaving it writes the note line when anything was dropped. Every
    chunk written is flushed, so the log follows the agent while it runs.
    """

    def __init__(self, path: Path, limit: int = AGENT_LOG_MAX_BYTES) -> None:
        """Open `path` for appending (created with its folder when missing).

        Args:
            path: the log (the run folder's `AGENT_LOG`).
            limit: the most bytes of output the file may hold, earlier turns' included.

        Raises:
            OSError: the file cannot be opened.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.limit = limit
        self._file = path.open("ab")
        self.written = self._file.tell()
        """Bytes in the file (what earlier turns left, then this turn's)."""
        self.dropped = 0
        """Bytes of this turn's output not written: they came after the file was full."""

    def write(self, chunk: bytes) -> None:
        """Append what of `chunk` fits under the limit; count the rest as dropped."""
        room = max(0, self.limit - self.written)
        kept = chunk[:room]
        if kept:
            self._file.write(kept)
            self._file.flush()
            self.written += len(kept)
        self.dropped += len(chunk) - len(kept)

    def close(self) -> None:
        """Write the note line when output was dropped (see the module docstring), then close."""
        if self.dropped and not self._file.closed:
            self._file.write(
                f"\n{CUT_NOTE} {AGENT_LOG} keeps the first {self.limit} bytes; "
                f"{self.dropped} more bytes of this turn were dropped\n".encode()
            )
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
