"""ReplayEngine's indexed matching against the linear-scan algorithm it replaced (the oracle,
kept here only): the same decisions, divergences, stops and counters, request by request, on
random recordings (several threads, retries, side calls, superseded attempts, cut points) and
random request sequences (divergent requests, injected faults, `serve_again`), under every
divergence policy, with and without a live upstream (property-based, with hypothesis)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from reroll_contracts.proxy import Divergence, DivergencePolicy, StepDivergence
from reroll_contracts.retries import superseded
from reroll_contracts.trajectory import Exchange
from reroll_contracts.wire import format_for_path, format_named
from reroll_proxy.divergence import compare_normal, format_changed
from reroll_proxy.engine import Abort, Decision, Exhausted, Live, Replay, ReplayEngine
from reroll_proxy.threads import ThreadBook, Turn, assign_threads
from reroll_proxy.volatile import Volatility


@dataclass
class OracleEngine:
    """The engine before the index (reroll a57eb81): every lookup scans the recording."""

    recorded: Sequence[Exchange]
    cut_index: int
    has_live_upstream: bool
    divergence_policy: DivergencePolicy = "warn"
    volatility: Volatility = field(default_factory=Volatility)
    served_replayed: int = field(default=0, init=False)
    served_live: int = field(default=0, init=False)
    divergences: list[StepDivergence] = field(default_factory=list, init=False)
    stop: Abort | Exhausted | None = field(default=None, init=False)
    cutover_step: int | None = field(default=None, init=False)
    injected: int = field(default=0, init=False)
    threads: list[int] = field(default_factory=list, init=False)
    superseded: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._turns = [self._recorded_turn(exchange) for exchange in self.recorded]
        self.threads = assign_threads(self._turns)
        self.superseded = sorted(i for i in superseded(self.recorded) if i < self.cut_index)
        self._served = [i in self.superseded for i in range(len(self.recorded))]
        self._book = ThreadBook([None] * (max(self.threads) + 1 if self.threads else 0))
        self._before: dict[int, Turn | None] = {}

    @property
    def next_step(self) -> int:
        return self.served_replayed + self.served_live + self.injected

    @property
    def replaying(self) -> bool:
        return self._first_unserved() is not None and self.cutover_step is None and self.stop is None

    def inject(self) -> int:
        self.injected += 1
        return self.next_step - 1

    def serve_again(self, decision: Replay) -> None:
        self._served[decision.index] = False
        self._book.lasts[decision.thread] = self._before.pop(decision.index, None)
        self.served_replayed -= 1
        self.injected += 1

    def decide(self, step_body: dict[str, Any], api_format: str = "openai-chat") -> Decision:
        step = self.next_step
        if isinstance(self.stop, Abort):
            return Abort(step, self.stop.reason, self.stop.divergence)
        turn = Turn(api_format, format_named(api_format).normalise(self.volatility.apply(step_body)))
        if self.cutover_step is not None:
            return self._live(step, turn, None, self._book.find(turn))
        equal = next((index for index in self._heads() if self._turns[index] == turn), None)
        if equal is not None:
            return self._replay(step, equal, turn, None)
        beyond = next((i for i in range(self.cut_index, len(self._turns)) if self._turns[i] == turn), None)
        if beyond is not None:
            return self._live(step, turn, None, self.threads[beyond])
        thread = self._book.find(turn)
        if thread is None:
            thread = self._opened_by(turn)
        if thread is not None:
            head = self._head(thread)
            if head is not None:
                return self._diverged(step, head, turn, self._compare(head, turn))
            if any(self.threads[i] == thread for i in range(self.cut_index, len(self.threads))):
                return self._live(step, turn, None, thread)
            pending = next((i for i in self._heads() if self._book.lasts[self.threads[i]] is None), None)
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

    def _heads(self) -> list[int]:
        seen: set[int] = set()
        heads = []
        for index in range(self.cut_index):
            thread = self.threads[index]
            if not self._served[index] and thread not in seen:
                heads.append(index)
                seen.add(thread)
        return heads

    def _head(self, thread: int) -> int | None:
        return next((i for i in self._heads() if self.threads[i] == thread), None)

    def _first_unserved(self) -> int | None:
        return next((index for index in range(self.cut_index) if not self._served[index]), None)

    def _opened_by(self, turn: Turn) -> int | None:
        for index, recorded in enumerate(self._turns):
            thread = self.threads[index]
            if self._book.lasts[thread] is None and recorded is not None and recorded.root() == turn.root():
                return thread
        return None

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
        self._served[index] = True
        self._before[index] = self._book.lasts[thread]
        self._book.lasts[thread] = turn
        self.served_replayed += 1
        return Replay(step, self.recorded[index], divergence, thread, index)

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


PARAMS: list[dict[str, Any]] = [{}, {"temperature": 1}, {"temperature": 1.0}, {"top_p": 0}]
TOOLS = [[], [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]]
NUMBERS = ["1", "1.0", "true", "2"]
"""Tool-call arguments ``{"n": ...}``: 1, 1.0 and true are equal in Python, so are requests
that differ only there; matching must follow Python's equality, as the oracle's does."""

shapes = st.fixed_dictionaries(
    {
        "task": st.sampled_from("ABC"),
        "system": st.booleans(),
        "tools": st.sampled_from(range(len(TOOLS))),
        "params": st.sampled_from(range(len(PARAMS))),
        "depth": st.integers(0, 4),
        "flavour": st.sampled_from("xy"),
        "number": st.sampled_from(NUMBERS),
        "tail": st.sampled_from(["none", "fork", "prefill"]),
    }
)
"""A request's shape, from a small universe, so that requests often meet, extend or just miss
the recorded ones."""


def body(shape: dict[str, Any]) -> dict[str, Any]:
    """The openai-chat request body of `shape`: a task, then `depth` tool-calling turns, then a
    side call's user message (``fork``), a last assistant message (``prefill``) or nothing."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}] if shape["system"] else []
    messages.append({"role": "user", "content": f"Task {shape['task']}."})
    arguments = f'{{"n": {shape["number"]}}}'
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    for turn in range(shape["depth"]):
        text = f"step {turn} {shape['flavour'] if turn else 'x'}"
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
        messages.append({"role": "tool", "content": f"result {turn}", "tool_call_id": "c"})
    if shape["tail"] == "fork":
        messages.append({"role": "user", "content": "Summarise."})
    elif shape["tail"] == "prefill":  # the next turn's assistant message: its extension continues it
        text = f"step {shape['depth']} {shape['flavour'] if shape['depth'] else 'x'}"
        messages.append({"role": "assistant", "content": text, "tool_calls": [call]})
    return {"model": "m", "messages": messages, "tools": TOOLS[shape["tools"]], **PARAMS[shape["params"]]}


bodies = shapes.map(body)


EQUAL_NUMBER = {"1": "1.0", "1.0": "true", "true": "1", "2": "2"}
"""Each number's next Python-equal spelling."""


@st.composite
def recordings(draw: st.DrawFn) -> tuple[list[Exchange], list[dict[str, Any] | None]]:
    """Recorded exchanges whose requests open threads, extend earlier ones, repeat them (retries;
    some superseded; a repeat after its thread moved on opens a thread with an equal head), fork
    side calls, or are not JSON; some answers are errors. With the shape of each request (None:
    not JSON)."""
    exchanges: list[Exchange] = []
    drawn: list[dict[str, Any]] = []
    shapes_drawn: list[dict[str, Any] | None] = []
    for step in range(draw(st.integers(0, 14))):
        how = draw(st.sampled_from(["new", "again", "extend", "extend", "raw"])) if drawn else "new"
        shape: dict[str, Any] = draw(shapes) if how in ("new", "raw") else dict(draw(st.sampled_from(drawn)))
        if how == "extend":
            shape["depth"] += 1
            shape["tail"] = draw(st.sampled_from(["none", "none", "fork", "prefill"]))
            if draw(st.booleans()):
                shape["number"] = EQUAL_NUMBER[shape["number"]]
            if not draw(st.integers(0, 3)):  # a thread may change its tools (roots differ within it)
                shape["tools"] = 1 - shape["tools"]
        drawn.append(shape)
        shapes_drawn.append(None if how == "raw" else shape)
        metadata: dict[str, Any] = {"step": step}
        if step and how == "again" and draw(st.booleans()):
            metadata["retry"] = {"attempt": 1, "of_step": draw(st.integers(0, step - 1))}
        status = 200 if draw(st.integers(0, 7)) else 500
        exchanges.append(
            Exchange.model_validate(
                {
                    "request": {
                        "timestamp": "t",
                        "path": "/v1/chat/completions",
                        "body": "not json" if how == "raw" else body(shape),
                    },
                    "response": {"timestamp": "t", "status_code": status, "body": {"answer": step}},
                    "metadata": metadata,
                }
            )
        )
    return exchanges, shapes_drawn


actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), bodies),
        st.tuples(st.just("resend"), st.integers(0, 13)),  # exactly a recorded request
        st.tuples(st.just("resend"), st.integers(0, 13)),
        st.tuples(st.just("equal"), st.integers(0, 13)),  # one that differs only in 1 / 1.0 / true
        st.tuples(st.just("again"), st.integers(0, 30)),  # serve_again an earlier Replay
        st.tuples(st.just("inject"), st.just(0)),
    ),
    max_size=24,
)


def state(engine: ReplayEngine | OracleEngine) -> tuple[Any, ...]:
    return (
        engine.next_step,
        engine.served_replayed,
        engine.served_live,
        engine.injected,
        engine.stop,
        engine.cutover_step,
        engine.replaying,
        engine.divergences,
        engine.threads,
        engine.superseded,
    )


@settings(max_examples=600, deadline=None)
@given(
    recorded=recordings(),
    cut=st.floats(0, 1),
    live=st.booleans(),
    policy=st.sampled_from(["warn", "strict", "cutover"]),
    steps=actions,
)
def test_decides_exactly_as_the_linear_scan(
    recorded: tuple[list[Exchange], list[dict[str, Any] | None]],
    cut: float,
    live: bool,
    policy: DivergencePolicy,
    steps: list[tuple[str, Any]],
) -> None:
    recording, shapes_recorded = recorded
    cut_index = round(cut * len(recording))
    engine = ReplayEngine(recording, cut_index, live, policy)
    oracle = OracleEngine(recording, cut_index, live, policy)
    assert state(engine) == state(oracle)
    replays: list[Replay] = []
    for action, argument in steps:
        if action == "again":
            if replays:
                decision = replays[argument % len(replays)]
                engine.serve_again(decision)
                oracle.serve_again(decision)
        elif action == "inject":
            assert engine.inject() == oracle.inject()
        else:
            if action != "send" and not recording:
                continue
            sent = argument if action == "send" else recording[argument % len(recording)].request.body
            if action == "equal":
                shape = shapes_recorded[argument % len(recording)]
                sent = None if shape is None else body({**shape, "number": EQUAL_NUMBER[shape["number"]]})
            if not isinstance(sent, dict):
                continue
            decision = engine.decide(sent)
            assert decision == oracle.decide(sent)
            if isinstance(decision, Replay):
                replays.append(decision)
        assert state(engine) == state(oracle)
