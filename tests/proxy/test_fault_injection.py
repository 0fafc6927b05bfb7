"""Faults injected by the real proxy (subprocess) in front of the real scripted model, seen by the
official openai and anthropic SDKs."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import yaml
from reroll_contracts.faults import FaultsUsed

from tests.proxy.conftest import AGENT_MODEL, TOKEN, TURNS, Proxy, Service, StartProxy, ask, converse

pytestmark = pytest.mark.spawns  # every test runs the proxy and the scripted model as subprocesses

ask_twice = functools.partial(ask, attempts=2)
"""One agent turn that tries again once when a fault broke the first try."""

MESSAGES: list[Any] = [{"role": "user", "content": "List the files."}]


def faulted_proxy(
    start_proxy: StartProxy, tmp_path: Path, rules: list[dict[str, Any]], **config: Any
) -> Proxy:
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"seed": 1, "rules": rules}))
    return start_proxy(faults=FaultsUsed(plan_path=plan), **config)


def client(proxy: Proxy, retries: int, timeout: float = 30) -> openai.OpenAI:
    made = openai.OpenAI(base_url=proxy.base_url, api_key=TOKEN, max_retries=retries, timeout=timeout)
    proxy.clients.append(made)
    return made


def faults(proxy: Proxy) -> list[str | None]:
    return [line["metadata"]["fault"] and line["metadata"]["fault"]["spec"]["kind"] for line in proxy.lines()]


def test_429_burst_with_retry_after_then_success(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    burst = {
        "name": "burst",
        "times": 2,
        "fault": {"kind": "status", "status_code": 429, "retry_after_seconds": 0.5},
    }
    proxy = faulted_proxy(start_proxy, tmp_path, [burst], upstream_url=scripted_model.base_url)
    started = time.monotonic()
    turn = ask(client(proxy, retries=2), MESSAGES, stream=False)
    assert time.monotonic() - started >= 1.0  # the SDK waited Retry-After twice
    assert turn.tool_calls and turn.tool_calls[0][1] == "bash"
    lines = proxy.lines()
    assert [line["response"]["status_code"] for line in lines] == [429, 429, 200]
    assert [line["metadata"]["step"] for line in lines] == [0, 1, 2]
    assert lines[0]["metadata"]["fault"] == {
        "rule": "burst",
        "spec": {"kind": "status", "status_code": 429, "retry_after_seconds": 0.5},
        "replayed": False,
    }
    assert lines[0]["response"]["headers"]["retry-after"] == "0.5"
    assert lines[0]["response"]["body"]["error"]["code"] == "rate_limit_exceeded"
    assert lines[2]["metadata"]["fault"] is None and lines[2]["metadata"]["source"] == "live"


def test_anthropic_sdk_sees_529_overloaded(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"times": 1, "fault": {"kind": "status", "status_code": 529}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    with anthropic.Anthropic(base_url=proxy.root_url, api_key=TOKEN, max_retries=0, timeout=30) as sdk:
        with pytest.raises(anthropic.APIStatusError) as caught:
            sdk.messages.create(model=AGENT_MODEL, max_tokens=100, messages=MESSAGES)
        assert caught.value.status_code == 529
        body = caught.value.body
        assert isinstance(body, dict) and body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": body["error"]["message"]},
        }
        answer = sdk.messages.create(model=AGENT_MODEL, max_tokens=100, messages=MESSAGES)
    assert answer.content
    assert faults(proxy) == ["status", None]


def test_cut_of_a_response_that_is_not_streamed(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"times": 1, "fault": {"kind": "cut"}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    with pytest.raises(openai.APIConnectionError):
        ask(client(proxy, retries=0), MESSAGES, stream=False)
    assert ask(client(proxy, retries=0), MESSAGES, stream=False).tool_calls
    cut, whole = proxy.lines()
    assert cut["metadata"]["fault"]["spec"]["kind"] == "cut" and cut["response"]["body"] == whole["response"][
        "body"
    ] | {
        "id": cut["response"]["body"]["id"],
        "created": cut["response"]["body"]["created"],
    }


def test_stream_cut_after_two_events(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"times": 1, "fault": {"kind": "cut", "after_events": 2}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    sdk = client(proxy, retries=0)
    received = 0
    stream = sdk.chat.completions.create(model=AGENT_MODEL, messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIConnectionError), stream as events:
        for _ in events:
            received += 1
    assert received == 2
    turn = ask(sdk, MESSAGES, stream=True)  # the retry is served whole
    assert turn.tool_calls
    cut, whole = proxy.lines()
    assert (
        len(cut["response"]["events"]) == 2 and cut["metadata"]["error"] == "fault: stream cut after 2 events"
    )
    assert cut["metadata"]["fault"]["spec"] == {"kind": "cut", "after_events": 2}
    assert whole["metadata"]["fault"] is None and whole["response"]["events"][-1]["data"] == "[DONE]"


def test_connection_reset_then_sdk_retry(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"steps": [0, 2], "fault": {"kind": "reset"}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    with pytest.raises(openai.APIConnectionError):
        ask(client(proxy, retries=0), MESSAGES, stream=False)
    turn = ask(
        client(proxy, retries=1), MESSAGES, stream=False
    )  # step 1 served; step 2 reset; retried at step 3
    assert turn.tool_calls
    lines = proxy.lines()
    assert [line["response"]["status_code"] for line in lines] == [0, 200]
    assert lines[0]["metadata"]["error"] == "fault: connection reset, no response"


def test_malformed_body(start_proxy: StartProxy, scripted_model: Service, tmp_path: Path) -> None:
    rule = {"times": 2, "fault": {"kind": "malformed"}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    sdk = client(proxy, retries=0)
    with pytest.raises(ValueError):  # json.JSONDecodeError from the SDK's parse
        ask(sdk, MESSAGES, stream=False)
    with pytest.raises(ValueError):
        ask(sdk, MESSAGES, stream=True)
    lines = proxy.lines()
    assert [line["response"]["status_code"] for line in lines] == [200, 200]
    assert isinstance(lines[0]["response"]["body"], str) and lines[0]["response"]["body"].startswith('{"id"')


def test_latency_and_finite_stall(start_proxy: StartProxy, scripted_model: Service, tmp_path: Path) -> None:
    rules = [
        {"steps": [0], "fault": {"kind": "latency", "seconds": 0.6}},
        {"steps": [1], "fault": {"kind": "stall", "after_events": 1, "seconds": 0.6}},
    ]
    proxy = faulted_proxy(start_proxy, tmp_path, rules, upstream_url=scripted_model.base_url)
    sdk = client(proxy, retries=0)
    for stream in (False, True):
        started = time.monotonic()
        assert ask(sdk, MESSAGES, stream=stream).tool_calls
        assert time.monotonic() - started >= 0.6
    latency, stall = proxy.lines()
    assert latency["metadata"]["ttfb_ms"] >= 600 and stall["response"]["events"][-1]["data"] == "[DONE]"
    offsets = stall["response"]["event_offsets_ms"]
    assert offsets[1] - offsets[0] >= 550


def test_endless_stall_until_the_client_gives_up(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"times": 1, "fault": {"kind": "stall", "after_events": 1}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    with pytest.raises(openai.APITimeoutError):
        ask(client(proxy, retries=0, timeout=1.0), MESSAGES, stream=True)
    (line,) = proxy.lines()
    assert (
        len(line["response"]["events"]) == 1
        and line["metadata"]["error"] == "fault: stream stall after 1 events"
    )


def test_replay_reproduces_recorded_faults(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rules = [
        {"steps": [0], "fault": {"kind": "status", "status_code": 503}},
        {"steps": [2], "fault": {"kind": "reset"}},
        {"steps": [4], "fault": {"kind": "cut", "after_events": 1}},
    ]
    recorded = faulted_proxy(start_proxy, tmp_path, rules, upstream_url=scripted_model.base_url)
    turns, _ = converse(client(recorded, retries=2), TURNS, stream=True, ask_turn=ask_twice)
    recorded.service.stop()
    assert faults(recorded) == ["status", None, "reset", None, "cut", None]
    replay = start_proxy(replay_path=recorded.trajectory_path, policy="strict")
    again, _ = converse(client(replay, retries=2), TURNS, stream=True, ask_turn=ask_twice)
    assert [turn.tool_calls for turn in again] == [turn.tool_calls for turn in turns]
    lines = replay.lines()
    assert faults(replay) == faults(recorded) and all(
        line["metadata"]["source"] == "replayed" for line in lines
    )
    assert [line["metadata"]["fault"]["replayed"] for line in lines if line["metadata"]["fault"]] == [
        True
    ] * 3
    assert replay.status().divergences == []


def test_plan_faults_on_replayed_steps_do_not_consume_the_recording(
    start_proxy: StartProxy, stream_recording: Any, tmp_path: Path
) -> None:
    rules = [
        {"steps": [0], "fault": {"kind": "status", "status_code": 500}},
        {"steps": [2], "fault": {"kind": "cut", "after_events": 1}},
    ]
    proxy = faulted_proxy(
        start_proxy, tmp_path, rules, replay_path=str(stream_recording.path), policy="strict"
    )
    turns, _ = converse(client(proxy, retries=2), TURNS, stream=True, ask_turn=ask_twice)
    assert [turn.tool_calls for turn in turns] == [turn.tool_calls for turn in stream_recording.turns]
    assert faults(proxy) == ["status", None, "cut", None, None]
    status = proxy.status()
    assert status.divergences == [] and status.served_replayed == TURNS


def test_an_agent_that_hangs_up_mid_stream_is_recorded_with_what_it_received(
    start_proxy: StartProxy, scripted_model: Service, tmp_path: Path
) -> None:
    rule = {"times": 1, "fault": {"kind": "stall", "after_events": 1, "seconds": 1.0}}
    proxy = faulted_proxy(start_proxy, tmp_path, [rule], upstream_url=scripted_model.base_url)
    sdk = client(proxy, retries=0)
    with sdk.chat.completions.create(model=AGENT_MODEL, messages=MESSAGES, stream=True) as stream:
        next(iter(stream))  # the first chunk, then hang up during the stall
    deadline = time.monotonic() + 10
    while not proxy.lines() and time.monotonic() < deadline:
        time.sleep(0.05)
    (line,) = proxy.lines()
    events = line["response"]["events"]
    assert line["metadata"]["error"].startswith(f"the agent closed the connection after {len(events)} of ")
    assert 1 <= len(events) < 10 and events[-1]["data"] != "[DONE]", events
