"""The record / replay / cutover engine (pure: no sockets, no files).

A front end (the proxy's HTTP server, `reroll_proxy.host`) asks `ReplayEngine.decide` what to do
with each request the agent sends, in arrival order, and the engine answers with one `Decision`:

- `Replay` — serve a recorded exchange (with the divergence between the recorded and the live
  request, if any, under the ``warn`` policy);
- `Live` — forward the request to the live upstream: its thread is past the cut, or, under the
  ``cutover`` policy, from the first request that differs from the recording on;
- `Abort` — ``strict`` policy (or ``cutover`` without a live upstream) and the request differs
  from the recording; once aborted, every later request is aborted too;
- `Exhausted` — the request's thread is past the cut and there is no live upstream (replay-only);
- `StepLimited` — the rollout's step limit (``max_steps``) was reached; every later request too.

Matching, not position. Recorded exchange k is not simply served to the k-th request: an agent
with subagents or side calls sends several conversations at once, in an order that changes
from run to run. Each request is normalised into a `reroll_proxy.threads.Turn` (volatile parts
removed: `reroll_proxy.volatile`, then the format's normal form) and the recorded requests are
split into *threads* (`reroll_proxy.threads.assign_threads`: a request continues the thread
whose last request it extends with that request's answer). Only the first ``cut_index``
recorded exchanges, in recorded order, are *servable*; a thread's *head* is its first unserved
servable exchange. An arriving request is matched in this order:

1. equal (normal forms equal) to a thread's head: served, no divergence; among several equal
   heads, the first recorded wins (ties fall back to recorded order). Equal to a recorded
   exchange past the cut: live (a side call that forks a conversation, say, raced ahead);
2. continuing a thread (`reroll_proxy.threads.ThreadBook.find` over the requests served so far,
   replayed or live), or else opening a recorded thread that no request continued yet (same
   format, tools, system prompt and first user turn as its first exchange; the first recorded
   wins): if that thread has a head, the request diverges from it; if its recording goes on
   past the cut, the request goes live (`Exhausted` without an upstream); if its recording
   ended, it diverges from the first head of a thread no request continued yet (the summary
   says so), or, with none, goes live;
3. matching no thread: it diverges from the first unserved servable exchange (the summary
   says it matches no recorded thread).

A recorded attempt that an SDK retried after its connection dropped (`reroll_contracts.retries`) is
not servable: the agent, whose connection no longer drops, asks once and gets the retry's answer.

In 2 and 3, when every servable exchange was served, or a request already went live, the
request is a new conversation and goes live.

A divergence is handled by the policy: ``warn`` serves the head it was compared with,
``strict`` aborts, ``cutover`` goes live for good. For an agent with one conversation this is
the positional replay: request k extends request k-1 and meets exchange k. The thread of every
decision (`Replay.thread`, `Live.thread`; numbered as in the recording, new conversations after
them) is recorded as the exchange's ``metadata.thread``.

The first `Abort`, or the first `Exhausted` once every servable exchange was served, is kept
as `ReplayEngine.stop`: the front end reports it as the proxy's stop
(`reroll_contracts.proxy.ProxyStop`). An `Exhausted` while other threads still have servable
exchanges refuses that request only.

Steps count the served requests (`Replay`, `Live`, and faults injected in place of the model:
`ReplayEngine.inject`), from 0, so the exchanges recorded for them are numbered without gaps;
`Abort` and `Exhausted` carry the step the request would have had. An injected fault consumes
no recorded exchange: the agent's retry is served the exchange it would have got. Record mode
is ``cut_index=0`` with a live upstream.

Cost. A request costs the same however long the recording is (amortised): the engine keeps, per
thread, a heap of its unserved servable exchanges (the head is its smallest), the heads by
`match_key` of their request, the exchanges past the cut by `match_key`, the recorded threads by
`root_key` (of `Turn.root`), and a heap of every unserved servable exchange (the
first unserved). A lookup compares the request with the recorded requests that share its key
only (equality decides; the key only narrows). What still grows: `ThreadBook.find` (a request
that extends no head) and a divergence against a thread whose recording ended walk the threads,
and the key sets hold one entry per thread with that key.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reroll_contracts.proxy import Divergence, DivergencePolicy, StepDivergence
from reroll_contracts.retries import superseded
from reroll_contracts.trajectory import Exchange
from reroll_contracts.wire import format_for_path, format_named

from reroll_proxy.divergence import compare_normal, format_changed
from reroll_proxy.threads import ThreadBook, Turn, assign_threads
from reroll_proxy.volatile import Volatility


@dataclass(frozen=True)
class Replay:
    """Serve the recorded `exchange` for this step."""

    step: int
    exchange: Exchange
    divergence: Divergence | None
    """How the live request differs from the recorded one (``warn`` policy), else None."""
    thread: int = 0
    """The thread the exchange belongs to (`reroll_proxy.threads`)."""
    index: int = 0
    """The exchange's 0-based position in the recording."""


@dataclass(frozen=True)
class Live:
    """Forward this step to the live upstream."""

    step: int
    divergence: Divergence | None = None
    """The divergence that made the ``cutover`` policy go live here, else None."""
    thread: int | None = 0
    """The thread the request continues or opens (`reroll_proxy.threads`); None: not worked out
    yet (``decide(..., later=True)``), `ReplayEngine.thread_of` gives it."""


@dataclass(frozen=True)
class Abort:
    """Refuse the request: the replay left the recorded rails under the ``strict`` policy."""

    step: int
    reason: str
    divergence: Divergence
    """The divergence that caused the abort (the first one, for every later request too)."""


@dataclass(frozen=True)
class Exhausted:
    """Refuse the request: replay-only mode, and its thread served every exchange up to the cut."""

    step: int

    @property
    def reason(self) -> str:
        """One line for humans."""
        return f"replay-only: recorded responses exhausted at step {self.step}"


@dataclass(frozen=True)
class StepLimited:
    """Refuse the request: the rollout served its ``max_steps`` steps (``reroll run --max-steps``)."""

    step: int

    @property
    def reason(self) -> str:
        """One line for humans."""
        return f"the step limit was reached: {self.step} steps served"


Stop = Abort | Exhausted | StepLimited
"""A refusal kept as `ReplayEngine.stop`."""
Decision = Replay | Live | Abort | Exhausted | StepLimited


@dataclass
class ReplayEngine:
    """Decides, request by request, between replaying, going live, aborting and stopping.

    Args:
        recorded: the recorded exchanges, in recorded order (may be empty).
        cut_index: how many recorded exchanges (the first ones, in recorded order) may be
            replayed; 0 <= cut_index <= len(recorded).
        has_live_upstream: whether requests past the cut can go to a live model.
        divergence_policy: ``warn`` serves the recording anyway and notes the divergence;
            ``strict`` aborts; ``cutover`` goes live from the first divergence on (aborts,
            like ``strict``, without a live upstream).
        volatility: the declared volatile parts removed from every body before matching and
            comparing (`reroll_proxy.volatile`); none by default.
        max_steps: the steps served before every further request is refused (`StepLimited`);
            None: no limit.

    Raises:
        ValueError: `cut_index` is out of range.
    """

    recorded: Sequence[Exchange]
    cut_index: int
    has_live_upstream: bool
    divergence_policy: DivergencePolicy = "warn"
    volatility: Volatility = field(default_factory=Volatility)
    max_steps: int | None = None
    served_replayed: int = field(default=0, init=False)
    """Requests answered from the recording."""
    served_live: int = field(default=0, init=False)
    """Requests forwarded to the live upstream."""
    divergences: list[StepDivergence] = field(default_factory=list, init=False)
    """Every divergence seen, in step order."""
    stop: Stop | None = field(default=None, init=False)
    """The first refused request (strict divergence, replay-only past the cut once every
    servable exchange was served, or the step limit), else None; every later request is refused too."""
    cutover_step: int | None = field(default=None, init=False)
    """The step at which the ``cutover`` policy went live early, else None."""
    injected: int = field(default=0, init=False)
    """Steps taken by injected faults that consumed no recorded exchange."""
    threads: list[int] = field(default_factory=list, init=False)
    """The thread of each recorded exchange (`reroll_proxy.threads.assign_threads`)."""
    superseded: list[int] = field(default_factory=list, init=False)
    """Servable recorded attempts an SDK retried after its connection dropped: never served, the
    retry's answer is (`reroll_contracts.retries.superseded`)."""

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps {self.max_steps} is not positive")
        if not 0 <= self.cut_index <= len(self.recorded):
            count = len(self.recorded)
            raise ValueError(f"cut_index {self.cut_index} is outside 0..{count} (the recorded exchanges)")
        self._turns = [self._recorded_turn(exchange) for exchange in self.recorded]
        self.threads = assign_threads(self._turns)
        self.superseded = sorted(i for i in superseded(self.recorded) if i < self.cut_index)
        self._served = [i in self.superseded for i in range(len(self.recorded))]
        self._book = ThreadBook([None] * (max(self.threads) + 1 if self.threads else 0))
        """The last request served in each thread (replayed or live), for `ThreadBook.find`."""
        self._unthreaded: list[tuple[int, str, dict[str, Any]]] = []
        """(step, API format, body) of the requests decided ``later`` whose thread is not known yet."""
        self._late_threads: dict[int, int] = {}
        """The threads `resolve_threads` worked out, by step, until `thread_of` gives them."""
        self._before: dict[int, Turn | None] = {}
        """Per served exchange, its thread's last request before it (for `serve_again`)."""
        self._keys = [None if turn is None else match_key(turn) for turn in self._turns]
        self._queues: dict[int, list[int]] = {}
        """Per thread, a heap of its unserved servable exchanges (its head first)."""
        self._heads_by_key: dict[Hashable, set[int]] = {}
        """The heads whose request is not None, by `match_key`."""
        self._unserved = [index for index in range(self.cut_index) if not self._served[index]]
        """A heap of the unserved servable exchanges; served ones are dropped when they surface."""
        for index in self._unserved:
            self._queues.setdefault(self.threads[index], []).append(index)  # ascending: a heap
        for queue in self._queues.values():
            self._add_head(queue[0])
        self._beyond: dict[Hashable, list[int]] = {}
        """The exchanges past the cut, by `match_key`, in recorded order."""
        self._past_cut_threads = set(self.threads[self.cut_index :])
        self._roots: dict[Hashable, dict[int, list[int]]] = {}
        """Per root key, per thread (in order of its first exchange with that key), the
        exchanges of the thread with that key, in recorded order."""
        for index, turn in enumerate(self._turns):
            if turn is None:
                continue
            if index >= self.cut_index:
                self._beyond.setdefault(self._keys[index], []).append(index)
            thread_indices = self._roots.setdefault(root_key(turn), {})
            thread_indices.setdefault(self.threads[index], []).append(index)

    @property
    def next_step(self) -> int:
        """The step the next served request gets."""
        return self.served_replayed + self.served_live + self.injected

    @property
    def limited(self) -> bool:
        """Whether the step limit was reached: the next request is refused (`StepLimited`)."""
        return self.max_steps is not None and self.next_step >= self.max_steps

    @property
    def replaying(self) -> bool:
        """Whether a servable exchange is left (and no cutover or stop ended the replay)."""
        return self._first_unserved() is not None and self.cutover_step is None and self.stop is None

    def inject(self) -> int:
        """Take the next step for a fault answered in place of the model (no recording consumed).

        Returns:
            The step.
        """
        self.injected += 1
        return self.next_step - 1

    def serve_again(self, decision: Replay) -> None:
        """`decision`'s recorded exchange was not delivered whole (a fault broke it): it is
        servable again (the agent's retry gets it), and `decision`'s step counts as injected."""
        index = decision.index
        if self._served[index]:
            self._served[index] = False
            heapq.heappush(self._unserved, index)
            queue = self._queues.setdefault(decision.thread, [])
            if queue and queue[0] < index:
                heapq.heappush(queue, index)
            else:
                if queue:
                    self._drop_head(queue[0])
                heapq.heappush(queue, index)
                self._add_head(index)
        self._book.lasts[decision.thread] = self._before.pop(decision.index, None)
        self.served_replayed -= 1
        self.injected += 1

    def decide(
        self, step_body: dict[str, Any], api_format: str = "openai-chat", later: bool = False
    ) -> Decision:
        """Decide what to do with the next request (see the module docstring).

        Args:
            step_body: the request's JSON body (not changed after this call).
            api_format: the request's API format name (see `reroll_contracts.wire`).
            later: in record mode (nothing recorded, a live upstream), where every request goes
                live, leave the thread (``Live.thread`` None) to `resolve_threads` / `thread_of`:
                normalising the request is the costliest part of a decision, and the front end
                does it while the upstream answers, off the agent's path.

        Returns:
            The decision; `Replay` and `Live` advance the step counter.

        Raises:
            KeyError: `api_format` is unknown.
        """
        step = self.next_step
        if isinstance(self.stop, Abort):
            return Abort(step, self.stop.reason, self.stop.divergence)
        if self.limited:
            self.stop = self.stop or StepLimited(step)
            return StepLimited(step)
        if later and not self.recorded and self.has_live_upstream:
            self._unthreaded.append((step, api_format, step_body))
            self.served_live += 1
            return Live(step, None, None)
        self.resolve_threads()  # the book must have every earlier request
        turn = Turn(api_format, format_named(api_format).normalise(self.volatility.apply(step_body)))
        if self.cutover_step is not None:
            return self._live(step, turn, None, self._book.find(turn))
        key = match_key(turn)
        heads = sorted(self._heads_by_key.get(key, ()))
        equal = next((index for index in heads if self._turns[index] == turn), None)
        if equal is not None:
            return self._replay(step, equal, turn, None)
        beyond = next((i for i in self._beyond.get(key, ()) if self._turns[i] == turn), None)
        if beyond is not None:
            return self._live(step, turn, None, self.threads[beyond])
        thread = self._book.find(turn)
        if thread is None:
            thread = self._opened_by(turn)
        if thread is not None:
            head = self._head(thread)
            if head is not None:
                return self._diverged(step, head, turn, self._compare(head, turn))
            if thread in self._past_cut_threads:
                return self._live(step, turn, None, thread)  # the thread is past the cut
            untouched = (
                queue[0] for t, queue in self._queues.items() if queue and self._book.lasts[t] is None
            )
            pending = min(untouched, default=None)
            why = f"continues thread {thread}, whose recording ended"
        else:
            pending, why = self._first_unserved(), "matches no recorded thread"
        if pending is None or self.served_live:
            return self._live(step, turn, None, thread)
        divergence = self._compare(pending, turn)
        if divergence is not None:
            summary = f"{why}; against exchange {pending}: {divergence.summary}"
            divergence = divergence.model_copy(update={"summary": summary})
        return self._diverged(step, pending, turn, divergence)

    def _recorded_turn(self, exchange: Exchange) -> Turn | None:
        body = exchange.request.body
        if not isinstance(body, dict):
            return None
        wire = format_for_path(exchange.request.path)
        api_format = wire.name if wire is not None else exchange.metadata.api_format
        return Turn(api_format, format_named(api_format).normalise(self.volatility.apply(body)))

    def _compare(self, index: int, turn: Turn) -> Divergence | None:
        recorded = self._turns[index]
        if recorded is None:
            return None
        if recorded.api_format != turn.api_format:
            return format_changed(recorded.api_format, turn.api_format)
        return compare_normal(recorded.request, turn.request)

    def _add_head(self, index: int) -> None:
        key = self._keys[index]
        if key is not None:
            self._heads_by_key.setdefault(key, set()).add(index)

    def _drop_head(self, index: int) -> None:
        key = self._keys[index]
        if key is not None:
            heads = self._heads_by_key[key]
            heads.discard(index)
            if not heads:
                del self._heads_by_key[key]

    def _head(self, thread: int) -> int | None:
        queue = self._queues.get(thread)
        return queue[0] if queue else None

    def _first_unserved(self) -> int | None:
        unserved = self._unserved
        while unserved and self._served[unserved[0]]:
            heapq.heappop(unserved)
        return unserved[0] if unserved else None

    def _opened_by(self, turn: Turn) -> int | None:
        """The thread of the first recorded exchange (servable or past the cut) whose thread no
        request continued yet and whose root (`Turn.root`) is `turn`'s: a thread `turn` opens."""
        root = turn.root()
        first = None
        for thread, indices in self._roots.get(root_key(turn), {}).items():
            if self._book.lasts[thread] is not None:
                continue
            for index in indices:
                if first is not None and index > first:
                    break
                recorded = self._turns[index]
                if recorded is not None and recorded.root() == root:
                    first = index
                    break
        return None if first is None else self.threads[first]

    def _diverged(self, step: int, index: int, turn: Turn, divergence: Divergence | None) -> Decision:
        if divergence is not None:
            self.divergences.append(StepDivergence(step=step, **divergence.model_dump()))
            if self.divergence_policy == "cutover" and self.has_live_upstream:
                self.cutover_step = step
                return self._live(step, turn, divergence, self.threads[index])
            if self.divergence_policy != "warn":
                self.stop = Abort(step, f"step {step}: {divergence.summary}", divergence)
                return self.stop
        return self._replay(step, index, turn, divergence)

    def _replay(self, step: int, index: int, turn: Turn, divergence: Divergence | None) -> Replay:
        thread = self.threads[index]
        queue = self._queues[thread]
        heapq.heappop(queue)  # index: only a head is ever served
        self._drop_head(index)
        if queue:
            self._add_head(queue[0])
        self._served[index] = True
        self._before[index] = self._book.lasts[thread]
        self._book.lasts[thread] = turn
        self.served_replayed += 1
        return Replay(step, self.recorded[index], divergence, thread, index)

    def resolve_threads(self) -> None:
        """Work out the threads of the requests decided ``later``, in step order (as `decide`
        would have, so the numbers are the same)."""
        unthreaded, self._unthreaded = self._unthreaded, []
        for step, api_format, body in unthreaded:
            turn = Turn(api_format, format_named(api_format).normalise(self.volatility.apply(body)))
            thread = self._book.assign(turn)
            self._late_threads[step] = thread

    def thread_of(self, step: int) -> int | None:
        """The thread of `step`, decided ``later`` (worked out now if it was not yet), once: the
        answer is forgotten after it is given. None for a step not decided ``later``."""
        self.resolve_threads()
        return self._late_threads.pop(step, None)

    def _live(
        self, step: int, turn: Turn, divergence: Divergence | None, thread: int | None
    ) -> Live | Exhausted:
        if not self.has_live_upstream:
            exhausted = Exhausted(step)
            if self._first_unserved() is None or self.cutover_step is not None:
                self.stop = self.stop or exhausted
            return exhausted
        thread = self._book.open() if thread is None else thread
        self._book.lasts[thread] = turn
        self.served_live += 1
        return Live(step, divergence, thread)


def match_key(turn: Turn) -> Hashable:
    """A key equal for equal turns (normal forms equal, as Python compares them: ``1 == 1.0 ==
    True``), cheap to compute: the format, the message count and the last message, frozen
    (`_frozen`). Unequal turns may share it (the engine compares the turns that do)."""
    messages = turn.messages
    return turn.api_format, len(messages), _frozen(messages[-1]) if messages else None


def root_key(turn: Turn) -> Hashable:
    """`match_key`'s counterpart for `Turn.root`: equal roots, equal keys (tools left out)."""
    api_format, _, messages = turn.root()
    return api_format, len(messages), _frozen(messages[-1]) if messages else None


def _frozen(value: Any) -> Hashable:
    """A JSON value (dicts, lists, scalars) as a hashable value that is equal to another's exactly
    when the JSON values are equal: dicts become frozensets of items, lists tuples."""
    if isinstance(value, dict):
        return frozenset((key, _frozen(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    scalar: Hashable = value  # str, int, float, bool or None
    return scalar
