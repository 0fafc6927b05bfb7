"""The record / replay / cutover engine (pure: no sockets, no files).

A front end (the aiohttp server) asks `ReplayEngine.decide` what to do with each request the
agent sends, in arrival order, and the engine answers with one `Decision`:

- `Replay` — step < cut_index: serve recorded exchange ``step`` (with the divergence between
  the recorded and the live request, if any, under the ``warn`` policy);
- `Live` — step >= cut_index and a live upstream exists: forward the request; also, under the
  ``cutover`` policy, from the first request that differs from the recording on;
- `Abort` — ``strict`` policy (or ``cutover`` without a live upstream) and the request differs
  from the recording; once aborted, every later request is aborted too;
- `Exhausted` — step >= cut_index and no live upstream (replay-only mode reached the cut).

Steps count the served requests (`Replay`, `Live`, and faults injected in place of the model:
`ReplayEngine.inject`), from 0, so the exchanges recorded for them are numbered without gaps;
`Abort` and `Exhausted` carry the step the request would have had. An injected fault consumes
no recorded exchange: the agent's retry is served the exchange it would have got. Record mode
is ``cut_index=0`` with a live upstream.

The engine never looks inside a body itself: it hands the recorded and the live body, with
their API format names, to `reroll_proxy.divergence`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from reroll_proxy.divergence import Divergence, compare_requests, format_changed
from reroll_proxy.exchange import Exchange
from reroll_proxy.formats import format_for_path

DivergencePolicy = Literal["warn", "strict", "cutover"]


@dataclass(frozen=True)
class Replay:
    """Serve the recorded `exchange` for this step."""

    step: int
    exchange: Exchange
    divergence: Divergence | None
    """How the live request differs from the recorded one (``warn`` policy), else None."""


@dataclass(frozen=True)
class Live:
    """Forward this step to the live upstream."""

    step: int
    divergence: Divergence | None = None
    """The divergence that made the ``cutover`` policy go live here, else None."""


@dataclass(frozen=True)
class Abort:
    """Refuse the request: the replay left the recorded rails under the ``strict`` policy."""

    step: int
    reason: str
    divergence: Divergence
    """The divergence that caused the abort (the first one, for every later request too)."""


@dataclass(frozen=True)
class Exhausted:
    """Refuse the request: replay-only mode served every recorded exchange up to the cut."""

    step: int


Decision = Replay | Live | Abort | Exhausted


@dataclass(frozen=True)
class DivergenceNote:
    """A divergence seen at a step."""

    step: int
    divergence: Divergence


@dataclass
class ReplayEngine:
    """Decides, request by request, between replaying, going live, aborting and stopping.

    Args:
        recorded: the recorded exchanges, in step order (may be empty).
        cut_index: how many recorded exchanges to serve before going live; 0 <= cut_index <=
            len(recorded).
        has_live_upstream: whether requests from the cut on can go to a live model.
        divergence_policy: ``warn`` serves the recording anyway and notes the divergence;
            ``strict`` aborts; ``cutover`` goes live from the first divergence on (aborts,
            like ``strict``, without a live upstream).

    Raises:
        ValueError: `cut_index` is out of range.
    """

    recorded: Sequence[Exchange]
    cut_index: int
    has_live_upstream: bool
    divergence_policy: DivergencePolicy = "warn"
    served_replayed: int = field(default=0, init=False)
    """Requests answered from the recording."""
    served_live: int = field(default=0, init=False)
    """Requests forwarded to the live upstream."""
    divergences: list[DivergenceNote] = field(default_factory=list, init=False)
    """Every divergence seen, in step order."""
    replay_exhausted: bool = field(default=False, init=False)
    """True once a replay-only request came after the cut."""
    aborted: str | None = field(default=None, init=False)
    """Why the engine aborted (strict divergence), else None."""
    cutover_step: int | None = field(default=None, init=False)
    """The step at which the ``cutover`` policy went live early, else None."""
    injected: int = field(default=0, init=False)
    """Steps taken by injected faults that consumed no recorded exchange."""
    _abort: Abort | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.cut_index <= len(self.recorded):
            count = len(self.recorded)
            raise ValueError(f"cut_index {self.cut_index} is outside 0..{count} (the recorded exchanges)")

    @property
    def next_step(self) -> int:
        """The step the next served request gets."""
        return self.served_replayed + self.served_live + self.injected

    @property
    def replaying(self) -> bool:
        """Whether the next request would be served from the recording."""
        return (
            self.next_step - self.injected < self.cut_index
            and self.cutover_step is None
            and self._abort is None
        )

    def inject(self) -> int:
        """Take the next step for a fault answered in place of the model (no recording consumed).

        Returns:
            The step.
        """
        self.injected += 1
        return self.next_step - 1

    def serve_again(self, decision: Replay) -> None:
        """`decision`'s recorded exchange was not delivered whole (a fault broke it): the next
        request is served it again, and `decision`'s step counts as injected."""
        self.served_replayed -= 1
        self.injected += 1

    def decide(self, step_body: dict[str, Any], api_format: str = "openai-chat") -> Decision:
        """Decide what to do with the next request.

        Args:
            step_body: the request's JSON body.
            api_format: the request's API format name (see `reroll_proxy.formats`).

        Returns:
            The decision; `Replay` and `Live` advance the step counter.
        """
        step = self.next_step
        if self._abort is not None:
            return Abort(step, self._abort.reason, self._abort.divergence)
        index = step - self.injected
        if index >= self.cut_index or self.cutover_step is not None:
            return self._live(step, None)
        exchange = self.recorded[index]
        divergence = _divergence(exchange, step_body, api_format)
        if divergence is not None:
            self.divergences.append(DivergenceNote(step, divergence))
            if self.divergence_policy == "cutover" and self.has_live_upstream:
                self.cutover_step = step
                return self._live(step, divergence)
            if self.divergence_policy != "warn":
                self._abort = Abort(step, f"step {step}: {divergence.summary}", divergence)
                self.aborted = self._abort.reason
                return self._abort
        self.served_replayed += 1
        return Replay(step, exchange, divergence)

    def _live(self, step: int, divergence: Divergence | None) -> Live | Exhausted:
        if not self.has_live_upstream:
            self.replay_exhausted = True
            return Exhausted(step)
        self.served_live += 1
        return Live(step, divergence)


def _divergence(exchange: Exchange, live_body: dict[str, Any], live_format: str) -> Divergence | None:
    recorded_body = exchange.request.body
    if not isinstance(recorded_body, dict):
        return None
    wire = format_for_path(exchange.request.path)
    recorded_format = wire.name if wire is not None else exchange.metadata.api_format
    if recorded_format != live_format:
        return format_changed(recorded_format, live_format)
    return compare_requests(recorded_body, live_body, live_format)
