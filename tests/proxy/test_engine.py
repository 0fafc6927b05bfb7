"""ReplayEngine, fed requests by hand: replay, cutover, record, abort, exhaustion."""

from __future__ import annotations

from typing import Any

import pytest
from reroll_proxy.engine import Abort, Exhausted, Live, Replay, ReplayEngine
from reroll_proxy.exchange import Exchange


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
    assert engine.decide(request(0)) == Replay(0, exchanges[0], None)
    assert engine.decide(request(1)) == Replay(1, exchanges[1], None)
    assert engine.decide(request(2)) == Live(2)
    assert engine.decide(request(3)) == Live(3)
    assert (engine.served_replayed, engine.served_live, engine.next_step) == (2, 2, 4)
    assert engine.divergences == [] and not engine.replay_exhausted and engine.aborted is None


def test_record_mode_is_cut_zero_with_an_upstream() -> None:
    engine = ReplayEngine([], cut_index=0, has_live_upstream=True)
    assert [engine.decide(request(step)) for step in range(3)] == [Live(0), Live(1), Live(2)]


def test_replay_only_is_exhausted_at_the_cut() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False)
    assert isinstance(engine.decide(request(0)), Replay)
    assert isinstance(engine.decide(request(1)), Replay)
    assert not engine.replay_exhausted
    assert engine.decide(request(2)) == Exhausted(2)
    assert engine.decide(request(2)) == Exhausted(2)
    assert engine.replay_exhausted and engine.served_replayed == 2


def test_warn_policy_serves_and_notes_the_divergence() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False, divergence_policy="warn")
    decision = engine.decide(request(0, task="Do something else."))
    assert isinstance(decision, Replay) and decision.exchange is exchanges[0]
    assert decision.divergence is not None and decision.divergence.message_index == 0
    assert [(note.step, note.divergence.field) for note in engine.divergences] == [
        (0, "messages[0].content[0].text")
    ]
    assert engine.decide(request(1)) == Replay(1, exchanges[1], None)


def test_strict_policy_aborts_for_good() -> None:
    engine = ReplayEngine(recorded(3), cut_index=3, has_live_upstream=True, divergence_policy="strict")
    assert isinstance(engine.decide(request(0)), Replay)
    decision = engine.decide(request(2))
    assert isinstance(decision, Abort) and decision.step == 1
    assert decision.reason.startswith("step 1: ") and decision.divergence.field == "message_count"
    assert engine.aborted == decision.reason
    later = engine.decide(request(1))
    assert isinstance(later, Abort) and later.reason == decision.reason
    assert (engine.served_replayed, engine.served_live, len(engine.divergences)) == (1, 0, 1)


def test_model_swap_is_not_divergence() -> None:
    engine = ReplayEngine(recorded(1), cut_index=1, has_live_upstream=False, divergence_policy="strict")
    assert engine.decide(request(0) | {"model": "another"}) == Replay(0, engine.recorded[0], None)


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
    assert engine.decide(request(2)) == Live(2)
    assert (engine.served_replayed, engine.served_live, engine.cutover_step) == (1, 2, 1)
    assert engine.aborted is None and [note.step for note in engine.divergences] == [1]


def test_cutover_policy_without_upstream_aborts_like_strict() -> None:
    engine = ReplayEngine(recorded(2), cut_index=2, has_live_upstream=False, divergence_policy="cutover")
    decision = engine.decide(request(0, task="Something else."))
    assert isinstance(decision, Abort) and engine.aborted == decision.reason
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
    assert engine.decide(request(0)) == Replay(1, exchanges[0], None)
    assert engine.decide(request(1)) == Replay(2, exchanges[1], None)
    assert not engine.replaying and engine.inject() == 3
    assert engine.decide(request(2)) == Live(4)
    assert (engine.served_replayed, engine.served_live, engine.injected) == (2, 1, 2)


def test_a_replayed_step_broken_by_a_fault_is_served_again() -> None:
    exchanges = recorded(2)
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False, divergence_policy="strict")
    broken = engine.decide(request(0))
    assert isinstance(broken, Replay)
    engine.serve_again(broken)  # a cut mid-way: the agent retries the same request
    assert engine.decide(request(0)) == Replay(1, exchanges[0], None)
    assert engine.decide(request(1)) == Replay(2, exchanges[1], None)
    assert engine.decide(request(2)) == Exhausted(3)
