"""Which recorded attempts a replay skips: an answered attempt its SDK sent again is superseded by
the retry; an attempt that got an error or an injected fault keeps its place (pure: recorded
exchanges built by hand)."""

from __future__ import annotations

from typing import Any

from reroll_contracts.retries import superseded
from reroll_contracts.trajectory import Exchange


def exchange(
    step: int, body: dict[str, Any], status: int = 200, retry_of: int | None = None, fault: str | None = None
) -> Exchange:
    """A recorded exchange of `step` asking `body`; a retry of step `retry_of`, cut by `fault`."""
    metadata: dict[str, Any] = {"step": step}
    if retry_of is not None:
        metadata["retry"] = {"attempt": 1, "of_step": retry_of}
    if fault is not None:
        metadata["fault"] = {"rule": "r0", "spec": {"kind": fault}}
    return Exchange.model_validate(
        {
            "request": {"timestamp": "t", "path": "/v1/chat/completions", "body": body},
            "response": {"timestamp": "t", "status_code": status, "body": {"answer": step}},
            "metadata": metadata,
        }
    )


FIRST = {"model": "m", "messages": [{"role": "user", "content": "Do it."}]}
SECOND = {"model": "m", "messages": [{"role": "user", "content": "Go on."}]}


def test_an_answered_attempt_its_sdk_sent_again_is_superseded_by_the_retry() -> None:
    exchanges = [exchange(0, FIRST), exchange(1, FIRST, retry_of=0), exchange(2, SECOND)]
    assert superseded(exchanges) == {0}


def test_positions_not_steps_are_returned() -> None:
    exchanges = [exchange(7, FIRST), exchange(8, FIRST, retry_of=7)]
    assert superseded(exchanges) == {0}


def test_an_attempt_that_got_an_error_keeps_its_place() -> None:
    exchanges = [exchange(0, FIRST, status=500), exchange(1, FIRST, retry_of=0), exchange(2, SECOND)]
    assert superseded(exchanges) == set()


def test_an_attempt_cut_by_an_injected_fault_keeps_its_place() -> None:
    exchanges = [exchange(0, FIRST, fault="cut"), exchange(1, FIRST, retry_of=0)]
    assert superseded(exchanges) == set()


def test_a_retry_of_nothing_recorded_supersedes_nothing() -> None:
    exchanges = [exchange(0, FIRST), exchange(1, SECOND, retry_of=None), exchange(2, SECOND, retry_of=5)]
    assert superseded(exchanges) == set()
