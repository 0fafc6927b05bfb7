"""ReplayEngine, fed requests by hand: replay, cutover, record, abort, exhaustion, and thread
matching of concurrent conversations arriving in any order (property-based, with hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reroll_contracts.proxy import VolatileRule
from reroll_contracts.trajectory import Exchange
from reroll_proxy.engine import Abort, Exhausted, Live, Replay, ReplayEngine, StepLimited
from reroll_proxy.volatile import Volatility


def request(step: int, task: str = "Do it.") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for turn in range(step):
        messages.append({"role": "assistant", "content": f"answer {turn}"})
        messages.append({"role": "user", "content": f"observation {turn}"})
    return {"model": "m", "messages": messages}


def recorded(count: int) -> list[Exchange]:
    return [
        Exchange.model_validate(
            {
                "request": {"timestamp": "t", "path": "/v1/chat/completions", "body": request(step)},
                "response": {"timestamp": "t", "status_code": 200, "body": {"answer": step}},
                "metadata": {"step": step},
            }
        )
        for step in range(count)
    ]


def test_replays_in_order_then_goes_live() -> None:
    exchanges = recorded(3)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=True)
    assert engine.decide(request(0)) == Replay(0, exchanges[0], None, 0, 0)
    assert engine.decide(request(1)) == Replay(1, exchanges[1], None, 0, 1)
    assert engine.decide(request(2)) == Live(2)
    assert engine.decide(request(3)) == Live(3)
    assert (engine.served_replayed, engine.served_live, engine.next_step) == (2, 2, 4)
    assert engine.divergences == [] and engine.stop is None


def test_record_mode_is_cut_zero_with_an_upstream() -> None:
    engine = ReplayEngine([], cut_index=0, has_live_upstream=True)
    assert [engine.decide(request(step)) for step in range(3)] == [Live(0), Live(1), Live(2)]


def test_replay_only_is_exhausted_at_the_cut() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False)
    assert isinstance(engine.decide(request(0)), Replay)
    assert isinstance(engine.decide(request(1)), Replay)
    assert engine.stop is None
    assert engine.decide(request(2)) == Exhausted(2)
    assert engine.decide(request(2)) == Exhausted(2)
    assert engine.stop == Exhausted(2) and engine.served_replayed == 2


def test_the_step_limit_counts_replayed_and_live_steps_then_stops_for_good() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=True, max_steps=3)
    assert [type(engine.decide(request(step))) for step in range(3)] == [Replay, Replay, Live]
    assert engine.stop is None
    assert engine.decide(request(3)) == StepLimited(3) == engine.stop
    assert engine.decide(request(0)) == StepLimited(3)  # even a request the recording has
    assert (engine.served_replayed, engine.served_live) == (2, 1)


def test_a_step_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_steps 0"):
        ReplayEngine([], cut_index=0, has_live_upstream=True, max_steps=0)


def test_warn_policy_serves_and_notes_the_divergence() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False, divergence_policy="warn")
    decision = engine.decide(request(0, task="Do something else."))
    assert isinstance(decision, Replay) and decision.exchange is exchanges[0]
    assert decision.divergence is not None and decision.divergence.message_index == 0
    assert [(note.step, note.field) for note in engine.divergences] == [(0, "messages[0].content[0].text")]
    assert engine.decide(request(1)) == Replay(1, exchanges[1], None, 0, 1)


def test_strict_policy_aborts_for_good() -> None:
    engine = ReplayEngine(recorded(3), cut_index=3, has_live_upstream=True, divergence_policy="strict")
    assert isinstance(engine.decide(request(0)), Replay)
    decision = engine.decide(request(2))
    assert isinstance(decision, Abort) and decision.step == 1
    assert decision.reason.startswith("step 1: ") and decision.divergence.field == "message_count"
    assert engine.stop == decision
    later = engine.decide(request(1))
    assert isinstance(later, Abort) and later.reason == decision.reason
    assert (engine.served_replayed, engine.served_live, len(engine.divergences)) == (1, 0, 1)


def test_model_swap_is_not_divergence() -> None:
    engine = ReplayEngine(recorded(1), cut_index=1, has_live_upstream=False, divergence_policy="strict")
    assert engine.decide(request(0) | {"model": "another"}) == Replay(0, engine.recorded[0], None, 0, 0)


def test_recorded_body_that_is_not_an_object_is_not_compared() -> None:
    exchange = recorded(1)[0].model_copy(
        update={"request": recorded(1)[0].request.model_copy(update={"body": "raw"})}
    )
    engine = ReplayEngine([exchange], cut_index=1, has_live_upstream=False, divergence_policy="strict")
    assert isinstance(engine.decide(request(5)), Replay)


@pytest.mark.parametrize("cut_index", [-1, 3])
def test_cut_index_out_of_range(cut_index: int) -> None:
    with pytest.raises(ValueError, match=f"cut_index {cut_index} is outside 0..2"):
        ReplayEngine(recorded(2), cut_index=cut_index, has_live_upstream=True)


def test_cutover_policy_goes_live_at_the_first_divergence() -> None:
    engine = ReplayEngine(recorded(3), cut_index=3, has_live_upstream=True, divergence_policy="cutover")
    assert isinstance(engine.decide(request(0)), Replay)
    decision = engine.decide(request(1, task="Something else."))
    assert isinstance(decision, Live) and decision.step == 1 and decision.divergence is not None
    assert decision.divergence.classification == "observation_changed"
    assert engine.decide(request(2)) == Live(2, None, 1)  # the original task: a new conversation
    assert (engine.served_replayed, engine.served_live, engine.cutover_step) == (1, 2, 1)
    assert engine.stop is None and [note.step for note in engine.divergences] == [1]


def test_cutover_policy_without_upstream_aborts_like_strict() -> None:
    engine = ReplayEngine(recorded(2), cut_index=2, has_live_upstream=False, divergence_policy="cutover")
    decision = engine.decide(request(0, task="Something else."))
    assert isinstance(decision, Abort) and engine.stop == decision
    assert engine.cutover_step is None


def test_a_request_in_another_format_diverges() -> None:
    engine = ReplayEngine(recorded(1), cut_index=1, has_live_upstream=False, divergence_policy="warn")
    decision = engine.decide({"model": "m", "input": "Do it."}, "openai-responses")
    assert isinstance(decision, Replay) and decision.divergence is not None
    assert decision.divergence.field == "api_format" and decision.divergence.classification == "agent_changed"


def test_injected_faults_take_steps_but_consume_no_recording() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=True)
    assert engine.replaying and engine.inject() == 0  # e.g. a 429 in place of step 0's answer
    assert engine.decide(request(0)) == Replay(1, exchanges[0], None, 0, 0)
    assert engine.decide(request(1)) == Replay(2, exchanges[1], None, 0, 1)
    assert not engine.replaying and engine.inject() == 3
    assert engine.decide(request(2)) == Live(4)
    assert (engine.served_replayed, engine.served_live, engine.injected) == (2, 1, 2)


def test_a_replayed_step_broken_by_a_fault_is_served_again() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False, divergence_policy="strict")
    broken = engine.decide(request(0))
    assert isinstance(broken, Replay)
    engine.serve_again(broken)  # a cut mid-way: the agent retries the same request
    assert engine.decide(request(0)) == Replay(1, exchanges[0], None, 0, 0)
    assert engine.decide(request(1)) == Replay(2, exchanges[1], None, 0, 1)
    assert engine.decide(request(2)) == Exhausted(3)


# Concurrent conversations: two subagents with the same system prompt, the main agent, and side
# calls (a title, and a summary that forks the main conversation), arriving in any order.
TURNS = {"main": 3, "sub-a": 2, "sub-b": 2, "title": 1, "summary": 1}


def thread_request(name: str, turn: int) -> dict[str, Any]:
    """Request `turn` of conversation `name`: each extends the previous one and its answer."""
    if name == "summary":  # the main conversation after its first answer, plus a question
        return {"model": "m", "messages": [*thread_request("main", 1)["messages"], user("Summarise.")]}
    system, task = {
        "main": ("You are the main agent.", "Fix the bug."),
        "sub-a": ("You are a subagent.", "Read a.py."),
        "sub-b": ("You are a subagent.", "Read b.py."),
        "title": ("Write a title.", "Fix the bug."),
    }[name]
    messages = [{"role": "system", "content": system}, user(task)]
    for done in range(turn):
        messages += [{"role": "assistant", "content": f"{name} answer {done}"}, user(f"{name} output {done}")]
    return {"model": "m", "messages": messages}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def record_threads(order: list[str]) -> list[Exchange]:
    """The exchanges of conversations arriving in `order` (the k-th `name` is its turn k)."""
    return [
        Exchange.model_validate(
            {
                "request": {
                    "timestamp": "t",
                    "path": "/v1/chat/completions",
                    "body": thread_request(name, turn),
                },
                "response": {"timestamp": "t", "status_code": 200, "body": {"name": name, "turn": turn}},
            }
        )
        for name, turn in numbered(order)
    ]


def numbered(order: list[str]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    turns = []
    for name in order:
        turns.append((name, seen.get(name, 0)))
        seen[name] = turns[-1][1] + 1
    return turns


def causal(order: list[str]) -> list[str]:
    """`order` with the summary after the main agent's first answer (its request contains it)."""
    order = list(order)
    first_main, summary = order.index("main"), order.index("summary")
    if summary < first_main:
        order[first_main], order[summary] = order[summary], order[first_main]
    return order


ARRIVALS = st.permutations([name for name, count in TURNS.items() for _ in range(count)]).map(causal)


@settings(max_examples=150, deadline=None)
@given(recorded_order=ARRIVALS, replay_order=ARRIVALS)
def test_every_request_gets_its_own_threads_answer_whatever_the_order(
    recorded_order: list[str], replay_order: list[str]
) -> None:
    exchanges = record_threads(recorded_order)
    position = {turn: index for index, turn in enumerate(numbered(recorded_order))}
    engine = ReplayEngine(exchanges, len(exchanges), has_live_upstream=False, divergence_policy="strict")
    threads: dict[str, set[int]] = {}
    for step, (name, turn) in enumerate(numbered(replay_order)):
        decision = engine.decide(thread_request(name, turn))
        assert isinstance(decision, Replay) and decision.step == step and decision.divergence is None
        assert decision.index == position[name, turn]
        assert decision.exchange.response.body == {"name": name, "turn": turn}
        assert decision.thread == engine.threads[decision.index]
        threads.setdefault(name, set()).add(decision.thread)
    # The subagents and the title are threads of their own; the summary forks the main agent's
    # conversation, so whichever of the two was recorded first continues it.
    own = [threads[name] for name in ("sub-a", "sub-b", "title")]
    assert all(len(ids) == 1 for ids in own) and len(set.union(*own)) == 3
    assert not set.union(*own) & (threads["main"] | threads["summary"])
    assert engine.stop is None and not engine.replaying
    assert engine.decide(thread_request("main", 3)) == Exhausted(len(exchanges))
    assert engine.stop == Exhausted(len(exchanges))


@settings(max_examples=100, deadline=None)
@given(recorded_order=ARRIVALS, replay_order=ARRIVALS, cut=st.integers(0, sum(TURNS.values())))
def test_the_first_cut_exchanges_are_replayed_and_the_rest_go_live(
    recorded_order: list[str], replay_order: list[str], cut: int
) -> None:
    exchanges = record_threads(recorded_order)
    replayed = set(numbered(recorded_order)[:cut])
    engine = ReplayEngine(exchanges, cut, has_live_upstream=True, divergence_policy="strict")
    for name, turn in numbered(replay_order):
        decision = engine.decide(thread_request(name, turn))
        assert isinstance(decision, Replay if (name, turn) in replayed else Live)
        assert decision.divergence is None
    assert (engine.served_replayed, engine.served_live, engine.divergences) == (cut, len(exchanges) - cut, [])


def test_threads_decided_later_are_the_threads_decided_at_once() -> None:
    """``later=True`` in record mode: every request goes live with no thread yet; worked out
    (in step order) by `resolve_threads`, or by `thread_of`, they are `decide`'s own numbers."""
    order = ["main", "sub-a", "sub-b", "main", "sub-b", "sub-a", "title", "main", "summary"]
    requests = [thread_request(name, turn) for name, turn in numbered(order)]
    at_once = ReplayEngine([], cut_index=0, has_live_upstream=True)
    expected = [decision.thread for decision in map(at_once.decide, requests) if isinstance(decision, Live)]
    later = ReplayEngine([], cut_index=0, has_live_upstream=True)
    decisions = [later.decide(body, later=True) for body in requests[:5]]
    assert decisions == [Live(step, None, None) for step in range(5)] and later.served_live == 5
    later.resolve_threads()
    decisions += [later.decide(body, later=True) for body in requests[5:]]
    assert [later.thread_of(step) for step in range(9)] == expected == [0, 1, 2, 0, 2, 1, 3, 0, 4]
    assert later.thread_of(3) is None  # given once
    replaying = ReplayEngine(record_threads(order), cut_index=9, has_live_upstream=True)
    assert isinstance(replaying.decide(requests[0], later=True), Replay)  # only record mode waits


def test_record_mode_numbers_threads_as_the_replay_does() -> None:
    order = ["main", "sub-a", "sub-b", "main", "sub-b", "sub-a", "title", "main", "summary"]
    recorder = ReplayEngine([], cut_index=0, has_live_upstream=True)
    live = [recorder.decide(thread_request(name, turn)) for name, turn in numbered(order)]
    assert [decision.thread for decision in live if isinstance(decision, Live)] == [0, 1, 2, 0, 2, 1, 3, 0, 4]
    assert ReplayEngine(record_threads(order), cut_index=9, has_live_upstream=False).threads == [
        0,
        1,
        2,
        0,
        2,
        1,
        3,
        0,
        4,
    ]


def test_a_tampered_observation_in_one_thread_is_caught_at_its_step_and_field() -> None:
    order = ["main", "sub-a", "sub-b", "sub-a", "main", "sub-b"]
    engine = ReplayEngine(
        record_threads(order), cut_index=6, has_live_upstream=False, divergence_policy="strict"
    )
    for name, turn in [("sub-b", 0), ("main", 0), ("sub-a", 0), ("sub-b", 1)]:
        assert isinstance(engine.decide(thread_request(name, turn)), Replay)
    tampered = thread_request("sub-a", 1)
    tampered["messages"][3]["content"] = "sub-a output 0, but different"
    decision = engine.decide(tampered)
    assert isinstance(decision, Abort) and decision.step == 4
    assert decision.divergence.field == "messages[3].content[0].text"
    assert decision.divergence.classification == "observation_changed"
    assert "matches no recorded thread" not in decision.reason


def test_a_request_of_no_recorded_thread_diverges_with_a_clear_reason() -> None:
    engine = ReplayEngine(record_threads(["main", "sub-a"]), cut_index=2, has_live_upstream=True)
    assert isinstance(engine.decide(thread_request("main", 0)), Replay)
    decision = engine.decide(thread_request("title", 0))
    assert isinstance(decision, Replay) and decision.index == 1 and decision.divergence is not None
    assert decision.divergence.summary.startswith("matches no recorded thread; against exchange 1: ")
    assert decision.divergence.field == "messages[0].content[0].text"


def test_a_fault_broken_exchange_is_served_again_to_its_own_thread() -> None:
    engine = ReplayEngine(record_threads(["main", "sub-a", "main"]), 3, False, divergence_policy="strict")
    first = engine.decide(thread_request("sub-a", 0))
    assert isinstance(first, Replay) and first.index == 1
    engine.serve_again(first)
    assert isinstance(engine.decide(thread_request("main", 0)), Replay)
    again = engine.decide(thread_request("sub-a", 0))
    assert isinstance(again, Replay) and (again.index, again.step) == (1, 2)
    assert engine.decide(thread_request("main", 1)) == Replay(3, engine.recorded[2], None, 0, 2)


def test_volatile_parts_are_not_divergences_but_the_rest_still_is() -> None:
    date = VolatileRule(pattern=r"\d{4}-\d{2}-\d{2}T[\d:.]+", label="datetime")
    workspace = [VolatileRule(value=path, label="workspace") for path in ("/tmp/a1b2", "/tmp/c3d4")]
    recorded_body = request(1, task="In /tmp/a1b2 at 2026-11-23T19:12:06.123456: fix it.")
    exchanges = recorded(1)
    exchanges[0].request.body = recorded_body
    live = request(1, task="In /tmp/c3d4 at 2026-11-24T08:00:00.000001: fix it.")
    volatility = Volatility([date, *workspace])
    engine = ReplayEngine(
        exchanges, 1, has_live_upstream=False, divergence_policy="strict", volatility=volatility
    )
    assert isinstance(engine.decide(live), Replay)
    strict = ReplayEngine(
        exchanges, 1, has_live_upstream=False, divergence_policy="strict", volatility=volatility
    )
    live["messages"][2]["content"] = "observation 0 in /tmp/c3d4, changed"
    decision = strict.decide(live)
    assert isinstance(decision, Abort) and decision.divergence.field == "messages[2].content[0].text"
    assert "<workspace>" in decision.divergence.diff


def test_a_thread_whose_recording_ended_diverges_to_a_thread_not_started_yet() -> None:
    exchanges = record_threads(["main", "title"])  # what an agent that diverged at once meets
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False)
    first = engine.decide(request(0, task="Something else."))
    assert isinstance(first, Replay) and first.index == 0 and first.divergence is not None
    second = engine.decide(request(1, task="Something else."))
    assert isinstance(second, Replay) and second.index == 1 and second.divergence is not None
    assert second.divergence.summary.startswith(
        "continues thread 0, whose recording ended; against exchange 1: "
    )
    assert engine.decide(request(2, task="Something else.")) == Exhausted(2)
    assert engine.stop == Exhausted(2)
