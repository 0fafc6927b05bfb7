"""SDK retries: told from new turns by their headers, and served by the replay engine in place of
the attempt they repeat when it was answered but never delivered (`reroll_contracts.retries`
says which; pure: fed requests and recorded exchanges by hand)."""

from __future__ import annotations

import json
import urllib.parse
from http.client import HTTPConnection
from typing import Any

import pytest
from multidict import CIMultiDict
from reroll_contracts.trajectory import RetryNote
from reroll_proxy.engine import Replay, ReplayEngine
from reroll_proxy.retries import RetryTracker

from tests.contracts.test_retries import exchange
from tests.proxy.conftest import AGENT_MODEL, TOKEN, Service, StartProxy
from tests.proxy.test_engine import request


def headers(**values: str) -> CIMultiDict[str]:
    return CIMultiDict({name.replace("_", "-"): value for name, value in values.items()})


def test_a_retry_count_or_a_repeated_idempotency_key_is_a_retry_of_the_earlier_attempt() -> None:
    tracker = RetryTracker()
    assert tracker.observe(headers(x_stainless_retry_count="0"), b"A", 0) is None
    assert tracker.observe(headers(x_stainless_retry_count="1"), b"A", 1) == RetryNote(attempt=1, of_step=0)
    assert tracker.observe(headers(x_stainless_retry_count="0"), b"B", 2) is None
    assert tracker.observe(headers(Idempotency_Key="k1"), b"C", 3) is None
    assert tracker.observe(headers(Idempotency_Key="k1"), b"C", 4) == RetryNote(
        attempt=1, of_step=3, idempotency_key="k1"
    )
    assert tracker.observe(headers(Idempotency_Key="k1"), b"C", 5) == RetryNote(
        attempt=2, of_step=4, idempotency_key="k1"
    )
    assert tracker.observe(headers(x_stainless_retry_count="2"), b"never seen", 6) == RetryNote(attempt=2)
    assert tracker.observe(headers(x_stainless_retry_count="x"), b"B", 7) is None  # junk is no retry


def test_a_dropped_answer_is_superseded_by_its_retry_and_the_replay_serves_the_retry() -> None:
    # Step 0 was answered but the agent's connection dropped: it retried (step 1) and went on.
    exchanges = [exchange(0, request(0)), exchange(1, request(0), retry_of=0), exchange(2, request(1))]
    engine = ReplayEngine(exchanges, cut_index=3, has_live_upstream=False, divergence_policy="strict")
    assert engine.superseded == [0]
    first, second = engine.decide(request(0)), engine.decide(request(1))
    assert isinstance(first, Replay) and first.index == 1 and first.divergence is None
    assert isinstance(second, Replay) and second.index == 2 and engine.divergences == []


def test_an_attempt_that_got_an_error_keeps_its_place() -> None:
    # Step 0 answered 500: the agent saw it and retried; a replay serves the error again.
    exchanges = [exchange(0, request(0), status=500), exchange(1, request(0), retry_of=0)]
    exchanges.append(exchange(2, request(1)))
    engine = ReplayEngine(exchanges, cut_index=3, has_live_upstream=False, divergence_policy="strict")
    assert engine.superseded == []
    decisions = [engine.decide(body) for body in (request(0), request(0), request(1))]
    assert [d.index if isinstance(d, Replay) else None for d in decisions] == [0, 1, 2]


def test_an_attempt_cut_by_an_injected_fault_keeps_its_place() -> None:
    # Step 0's stream was cut by the fault plan (status 200, metadata.fault): a replay reproduces
    # the cut, so the agent retries again and gets step 1.
    exchanges = [exchange(0, request(0), fault="cut"), exchange(1, request(0), retry_of=0)]
    engine = ReplayEngine(exchanges, cut_index=2, has_live_upstream=False, divergence_policy="strict")
    assert engine.superseded == []
    decisions = [engine.decide(body) for body in (request(0), request(0))]
    assert [d.index if isinstance(d, Replay) else None for d in decisions] == [0, 1]


@pytest.mark.spawns
def test_a_retry_after_a_dropped_connection_is_recorded_as_a_retry_and_replayed_as_one_turn(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    recorder = start_proxy(upstream_url=scripted_model.base_url)
    messages: list[Any] = [{"role": "user", "content": "List the files."}]
    body = json.dumps({"model": AGENT_MODEL, "messages": messages})
    url = urllib.parse.urlsplit(recorder.base_url)
    dropped = HTTPConnection(url.hostname or "", url.port)
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    dropped.request("POST", url.path + "/chat/completions", body, auth | {"x-stainless-retry-count": "0"})
    dropped.close()  # gone before the answer: its handler is cancelled, nothing is recorded
    client = recorder.client()
    retried = client.chat.completions.create(
        model=AGENT_MODEL, messages=messages, extra_headers={"x-stainless-retry-count": "1"}
    )
    answer = retried.choices[0].message
    follow_up: list[Any] = [
        *messages,
        answer.model_dump(exclude_none=True),
        {"role": "user", "content": "Go on."},
    ]
    client.chat.completions.create(model=AGENT_MODEL, messages=follow_up)
    recorder.service.stop()
    lines = recorder.lines()
    assert [line["metadata"].get("retry") for line in lines] == [
        {"attempt": 1, "of_step": None, "idempotency_key": None},
        None,
    ]
    assert [line["metadata"]["thread"] for line in lines] == [0, 0]

    proxy = start_proxy(replay_path=recorder.trajectory_path, policy="strict")
    replayed = proxy.client().chat.completions.create(model=AGENT_MODEL, messages=messages)
    proxy.client().chat.completions.create(model=AGENT_MODEL, messages=follow_up)
    assert replayed.choices[0].message.content == answer.content
    status = proxy.status()
    assert (status.served_replayed, status.divergences, status.stop) == (2, [], None)
    assert [line["metadata"]["replayed_from"] for line in proxy.lines()] == [0, 1]
