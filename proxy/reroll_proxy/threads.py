"""Threads: which conversation a request continues (pure: no I/O).

An agent may run several conversations with the model at once — subagents, side calls
(titles, commit messages, summaries) — so its requests form *threads*. A request, normalised
(`Turn`: the API format and the normal form of `reroll_contracts.wire.normal`, volatile parts
removed by `reroll_proxy.volatile`), continues a thread when the thread's last request's
messages are a prefix of its own and either

- more messages follow and the first of them is not a ``user`` or ``system`` message: the
  previous request, its answer (an ``assistant`` message, tool calls...) and what came of it
  (rank `EXTENDS`); a request that adds a ``user`` message right after the previous one is a
  side call that forks the conversation (a summary, a title), and starts a thread of its own;
- or no message follows: the same request again, a retry (rank `RETRY`).

`ThreadBook.assign` gives a request the thread it continues — the best rank, then the longest
previous request, then the lowest thread number — or a new thread, numbered from 0 in order of
first appearance. Since the assignment only depends on the requests in arrival order, the
threads the proxy records (``metadata.thread``) are the ones the replay engine recomputes from
the recorded requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reroll_contracts.wire.normal import NormalRequest

EXTENDS = 2
"""Rank of a request that continues a thread with its answer and more."""
RETRY = 1
"""Rank of a request equal to the thread's last one (an SDK retry)."""
_OPENING_ROLES = frozenset({"user", "system"})


@dataclass(frozen=True)
class Turn:
    """A request as matching sees it."""

    api_format: str
    """The request's API format name (`reroll_contracts.wire`)."""
    request: NormalRequest
    """Its normal form, volatile parts removed."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The normalised messages."""
        return self.request["messages"]

    def root(self) -> tuple[str, list[Any], list[dict[str, Any]]]:
        """What every request of the thread this one opens starts with: the format, the tools,
        and the messages up to the first user turn (the system prompt and the task)."""
        messages = self.messages
        first_user = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
        return self.api_format, self.request["tools"], messages[: first_user + 1]


def continuation_rank(previous: Turn, turn: Turn) -> int | None:
    """How `turn` continues a thread whose last request is `previous` (see the module docstring).

    Returns:
        `EXTENDS`, `RETRY`, or None when `turn` does not continue it.
    """
    if previous.api_format != turn.api_format:
        return None
    size = len(previous.messages)
    if turn.messages[:size] != previous.messages:
        return None
    if len(turn.messages) == size:
        return RETRY
    return EXTENDS if turn.messages[size].get("role") not in _OPENING_ROLES else None


@dataclass
class ThreadBook:
    """The threads seen so far, each with its last request (None: none seen yet)."""

    lasts: list[Turn | None] = field(default_factory=list)

    def find(self, turn: Turn) -> int | None:
        """The thread `turn` continues (best rank, longest previous request, lowest number), or None."""
        candidates = [
            (rank, len(previous.messages), -thread)
            for thread, previous in enumerate(self.lasts)
            if previous is not None and (rank := continuation_rank(previous, turn)) is not None
        ]
        return -max(candidates)[2] if candidates else None

    def open(self) -> int:
        """A new thread (its number)."""
        self.lasts.append(None)
        return len(self.lasts) - 1

    def assign(self, turn: Turn) -> int:
        """The thread `turn` continues, else a new one; `turn` becomes its last request."""
        thread = self.find(turn)
        thread = self.open() if thread is None else thread
        self.lasts[thread] = turn
        return thread


def assign_threads(turns: list[Turn | None]) -> list[int]:
    """The thread of each request, in arrival order (a request that is not JSON opens its own)."""
    book = ThreadBook()
    return [book.open() if turn is None else book.assign(turn) for turn in turns]
