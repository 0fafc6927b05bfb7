"""The proxy as a real subprocess, driven by the official openai SDK, in front of the real scripted model."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPConnection
from typing import Any

import openai
import pytest
from reroll_contracts.proxy import VolatileRule

from tests.proxy.conftest import (
    AGENT_MODEL,
    CONTROLLER_TOKEN,
    TOKEN,
    TURNS,
    UPSTREAM_KEY,
    Recording,
    Service,
    StartProxy,
    ask,
    converse,
    http_json,
    post_place,
)

pytestmark = pytest.mark.spawns  # every test runs the proxy and the scripted model as subprocesses


def chat_url(base_url: str) -> str:
    return base_url + "/chat/completions"


def error_body(exc: openai.APIStatusError) -> dict[str, Any]:
    return dict(exc.response.json()["error"])


def test_record_non_stream(start_proxy: StartProxy, scripted_model: Service) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    turns, _ = converse(proxy.client(), TURNS, stream=False)
    lines = proxy.lines()
    assert [line["metadata"]["step"] for line in lines] == [0, 1, 2]
    assert [line["metadata"]["thread"] for line in lines] == [0, 0, 0]
    assert {line["metadata"]["source"] for line in lines} == {"live"}
    for turn, line in zip(turns, lines, strict=True):
        assert line["metadata"]["stream"] is False and line["response"]["events"] is None
        assert line["metadata"]["model"] == AGENT_MODEL and line["metadata"]["api_format"] == "openai-chat"
        message = line["response"]["body"]["choices"][0]["message"]
        assert message["content"] == turn.content
        recorded_calls = [
            (c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ]
        assert recorded_calls == turn.tool_calls
        assert line["request"]["path"] == "/v1/chat/completions"
    assert len(lines[2]["request"]["body"]["messages"]) == 2 + 1 + 1 + 1 + 2


def test_record_stream(start_proxy: StartProxy, scripted_model: Service) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    turns, _ = converse(proxy.client(), TURNS, stream=True)
    lines = proxy.lines()
    assert len(lines) == TURNS
    for turn, line in zip(turns, lines, strict=True):
        events = line["response"]["events"]
        assert line["metadata"]["stream"] is True and line["metadata"]["ttfb_ms"] is not None
        assert len(events) == turn.chunks + 1 and events[-1]["data"] == "[DONE]"
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        message = body["choices"][0]["message"]
        assert message["content"] == turn.content
        assert [
            (c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ] == (turn.tool_calls)


def test_secrets_stay_off_disk_and_away_from_the_agent(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    completion = proxy.client().chat.completions.with_raw_response.create(
        model=AGENT_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert UPSTREAM_KEY not in json.dumps(dict(completion.headers))
    on_disk = proxy.trajectory_path.read_text() + proxy.service.log_path.read_text()
    assert UPSTREAM_KEY not in on_disk and TOKEN not in on_disk
    assert "authorization" not in proxy.lines()[0]["request"]["headers"]


def test_replay_non_stream_without_upstream(start_proxy: StartProxy, recording: Recording) -> None:
    proxy = start_proxy(replay_path=recording.path)
    turns, _ = converse(proxy.client(), TURNS, stream=False)
    assert turns == recording.turns
    status = proxy.status()
    assert (status.served_replayed, status.served_live, status.cut_index) == (TURNS, 0, TURNS)
    assert status.divergences == []
    lines = proxy.lines()
    assert [line["metadata"]["source"] for line in lines] == ["replayed"] * TURNS
    assert [line["metadata"]["model"] for line in lines] == [AGENT_MODEL] * TURNS
    assert [line["metadata"]["thread"] for line in lines] == [0] * TURNS


def test_a_side_call_replays_by_thread_in_any_order_with_the_sandbox_paths_volatile(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    side = [
        {"role": "system", "content": "Name this session."},
        {"role": "user", "content": "List the files."},
    ]
    recorded = [VolatileRule(value="/tmp/sandbox-1/app", label="workspace")]
    recorder = start_proxy(upstream_url=scripted_model.base_url, volatile=recorded)
    main_turns, _ = converse(
        recorder.client(), TURNS, stream=False, task="List the files in /tmp/sandbox-1/app."
    )
    title = ask(recorder.client(), side, stream=False)
    recorder.service.stop()
    assert [line["metadata"]["thread"] for line in recorder.lines()] == [0] * TURNS + [1]

    volatile = [*recorded, VolatileRule(value="/tmp/sandbox-2/app", label="workspace")]
    proxy = start_proxy(replay_path=recorder.trajectory_path, policy="strict", volatile=volatile)
    assert ask(proxy.client(), side, stream=False) == title  # the side call arrives first now
    turns, _ = converse(proxy.client(), TURNS, stream=False, task="List the files in /tmp/sandbox-2/app.")
    assert turns == main_turns
    status = proxy.status()
    assert (status.served_replayed, status.divergences, status.stop) == (TURNS + 1, [], None)
    lines = proxy.lines()
    assert [line["metadata"]["thread"] for line in lines] == [1] + [0] * TURNS
    assert [line["metadata"]["replayed_from"] for line in lines] == [TURNS, *range(TURNS)]


def test_replay_stream_reemits_the_recorded_events(
    start_proxy: StartProxy, stream_recording: Recording
) -> None:
    proxy = start_proxy(replay_path=stream_recording.path)
    turns, _ = converse(proxy.client(), TURNS, stream=True)
    assert [(t.content, t.tool_calls) for t in turns] == [
        (t.content, t.tool_calls) for t in stream_recording.turns
    ]
    assert [t.chunks for t in turns] == [t.chunks for t in stream_recording.turns]
    assert all(t.chunks > 3 for t in turns)
    recorded = [json.loads(line) for line in stream_recording.path.read_text().splitlines()]
    assert [line["response"]["events"] for line in proxy.lines()] == [
        line["response"]["events"] for line in recorded
    ]


def test_replay_of_a_stream_recording_to_a_non_stream_request(
    start_proxy: StartProxy, stream_recording: Recording
) -> None:
    proxy = start_proxy(replay_path=stream_recording.path)
    turns, _ = converse(proxy.client(), TURNS, stream=False)
    assert [(t.content, t.tool_calls) for t in turns] == [
        (t.content, t.tool_calls) for t in stream_recording.turns
    ]
    assert {line["metadata"]["stream"] for line in proxy.lines()} == {False}


def test_replay_streams_a_non_stream_recording(start_proxy: StartProxy, recording: Recording) -> None:
    proxy = start_proxy(replay_path=recording.path)
    turns, _ = converse(proxy.client(), TURNS, stream=True)
    assert [(t.content, t.tool_calls) for t in turns] == [(t.content, t.tool_calls) for t in recording.turns]
    assert all(t.chunks > 3 for t in turns)


def test_cutover_after_n_with_the_model_swapped(
    start_proxy: StartProxy, scripted_model: Service, recording: Recording
) -> None:
    proxy = start_proxy(
        replay_path=recording.path, cut_index=2, upstream_url=scripted_model.base_url, model="live-model"
    )
    turns, _ = converse(proxy.client(), TURNS, stream=False)
    assert turns == recording.turns
    status = proxy.status()
    assert (status.served_replayed, status.served_live) == (2, 1)
    lines = proxy.lines()
    assert [line["metadata"]["source"] for line in lines] == ["replayed", "replayed", "live"]
    assert [line["request"]["body"]["model"] for line in lines] == [AGENT_MODEL, AGENT_MODEL, "live-model"]
    assert lines[2]["metadata"]["model"] == "live-model"
    assert lines[2]["response"]["body"]["model"] == "live-model"


def test_non_stream_exchange_is_on_disk_when_the_response_arrives(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    client = proxy.client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    for step in range(TURNS):
        turn = ask(client, messages, stream=False)
        lines = proxy.lines()
        assert len(lines) == step + 1
        assert lines[step]["response"]["body"]["choices"][0]["message"]["content"] == turn.content
        messages.append({"role": "assistant", "content": turn.content or ""})


def test_stream_exchange_is_on_disk_when_done_arrives(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    body = {"model": AGENT_MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    url = urllib.parse.urlsplit(chat_url(proxy.base_url))
    connection = HTTPConnection(url.netloc, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        connection.request("POST", url.path, json.dumps(body), headers)
        response = connection.getresponse()
        events = 0
        while line := response.readline():
            events += line.startswith(b"data: {")
            if line.strip() == b"data: [DONE]":
                lines = proxy.lines()
                assert len(lines) == 1 and lines[0]["response"]["events"][-1]["data"] == "[DONE]"
                assert len(lines[0]["response"]["events"]) == events + 1
                break
        else:
            pytest.fail("the stream ended without data: [DONE]")
    finally:
        connection.close()


def test_replay_only_exhaustion_is_409(start_proxy: StartProxy, recording: Recording) -> None:
    proxy = start_proxy(replay_path=recording.path, cut_index=1)
    client = proxy.client()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "List the files."},
    ]
    assert ask(client, messages, stream=False) == recording.turns[0]
    with pytest.raises(openai.ConflictError) as caught:
        ask(client, messages, stream=False)
    error = error_body(caught.value)
    assert error["type"] == "replay_exhausted" and "exhausted at step 1" in error["message"]
    status = proxy.status()
    assert status.stop is not None and status.served_replayed == 1
    assert (status.stop.kind, status.stop.step) == ("replay_exhausted", 1)
    assert len(proxy.lines()) == 1


def test_the_step_limit_is_409_and_the_proxys_stop(start_proxy: StartProxy, scripted_model: Service) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url, max_steps=1)
    client = proxy.client()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    ask(client, messages, stream=False)
    with pytest.raises(openai.ConflictError) as caught:
        ask(client, messages, stream=False)
    assert error_body(caught.value)["type"] == "step_limit"
    status = proxy.status()
    assert status.stop is not None and (status.stop.kind, status.stop.step) == ("step_limit", 1)
    assert status.served_live == 1 and len(proxy.lines()) == 1


def test_strict_divergence_aborts(start_proxy: StartProxy, recording: Recording) -> None:
    proxy = start_proxy(replay_path=recording.path, policy="strict")
    with pytest.raises(openai.ConflictError) as caught:
        converse(proxy.client(), TURNS, stream=False, task="Delete the files.")
    assert error_body(caught.value)["type"] == "replay_diverged"
    assert "Delete the files." in error_body(caught.value)["message"]
    status = proxy.status()
    assert status.stop is not None and status.stop.kind == "replay_diverged" and status.served_replayed == 0
    assert status.stop.reason.startswith("step 0: ") and status.divergences[0].message_index == 1
    assert proxy.lines() == []


def test_warn_divergence_serves_and_reports(start_proxy: StartProxy, recording: Recording) -> None:
    proxy = start_proxy(replay_path=recording.path)
    turns, _ = converse(proxy.client(), TURNS, stream=False, task="Delete the files.")
    assert turns == recording.turns
    status = proxy.status()
    assert status.stop is None and status.served_replayed == TURNS
    assert [d.step for d in status.divergences] == [0, 1, 2]
    first = status.divergences[0]
    assert (first.message_index, first.field) == (1, "messages[1].content[0].text")
    assert first.classification == "observation_changed"
    assert "-List the files." in first.diff and "+Delete the files." in first.diff
    assert proxy.lines()[0]["metadata"]["divergence"]["field"] == "messages[1].content[0].text"


def test_upstream_error_is_passed_through_and_recorded(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    messages = [{"role": "user", "content": "hi"}] + [{"role": "assistant", "content": "x"}] * TURNS
    with pytest.raises(openai.BadRequestError) as caught:
        ask(proxy.client(), messages, stream=True)
    assert "script exhausted: turn 4 of 3" in error_body(caught.value)["message"]
    (line,) = proxy.lines()
    assert line["response"]["status_code"] == 400 and line["metadata"]["source"] == "live"
    assert "script exhausted" in line["response"]["body"]["error"]["message"]


def test_unreachable_upstream_is_502_and_recorded(start_proxy: StartProxy) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proxy = start_proxy(upstream_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(openai.InternalServerError) as caught:
        ask(proxy.client(), [{"role": "user", "content": "hi"}], stream=False)
    assert caught.value.status_code == 502 and "unreachable" in error_body(caught.value)["message"]
    (line,) = proxy.lines()
    assert line["response"]["status_code"] == 502 and "unreachable" in line["metadata"]["error"]


def test_every_exchange_records_the_trial_place_the_controller_set(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    place = {"turn": 3, "scene": "solve", "role": "solver", "round": 3}
    controller = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    hello = [{"role": "user", "content": "hi"}]
    ask(proxy.client(), hello, stream=False)
    assert post_place(proxy, place, controller) == 204
    ask(proxy.client(), [{"role": "user", "content": "again"}], stream=False)
    assert post_place(proxy, {**place, "turn": -1}, controller) == 400
    assert post_place(proxy, {"scene": "x"}, controller) == 400
    assert post_place(proxy, place, {"Authorization": "Bearer wrong"}) == 401
    assert [line["metadata"]["place"] for line in proxy.lines()] == [None, place]


def test_the_agent_token_cannot_forge_the_place_or_read_the_status(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    """Attack (issue 19 item 6): the agent POSTs a forged place with the token it was given."""
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    place = {"turn": 0, "scene": "main", "role": "agent", "round": 0}
    assert post_place(proxy, place, {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}) == 204
    forged = {"turn": 7, "scene": "main", "role": "reviewer", "round": 7}
    for headers in ({"Authorization": f"Bearer {TOKEN}"}, {"x-api-key": TOKEN}, {"api-key": TOKEN}):
        assert post_place(proxy, forged, headers) == 403, headers
    # Other spellings of the path reach the same route, or none: never a 204.
    for path in ("/_reroll/place/", "//_reroll/place", "/_reroll/./place", "/%5Freroll/place"):
        assert post_place(proxy, forged, {"Authorization": f"Bearer {TOKEN}"}, path) in (403, 404, 405), path
    agent = {"Authorization": f"Bearer {TOKEN}"}
    assert http_json("GET", proxy.root_url + "/_reroll/status", headers=agent)[0] == 403
    # The controller's token is no model credential either.
    code, _, _ = http_json(
        "POST", chat_url(proxy.base_url), {"model": "m", "messages": hello_world()},
        headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
    )  # fmt: skip
    assert code == 401
    ask(proxy.client(), hello_world(), stream=False)
    assert [line["metadata"]["place"] for line in proxy.lines()] == [place]
    assert proxy.status().served_live == 1  # the controller still reads it


def test_without_a_controller_token_the_controller_endpoints_are_closed(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url, controller_token_env=None)
    forged = {"turn": 7, "scene": "main", "role": "reviewer", "round": 7}
    assert post_place(proxy, forged, {"Authorization": f"Bearer {TOKEN}"}) == 403
    assert post_place(proxy, forged, {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}) == 401
    ask(proxy.client(), hello_world(), stream=False)
    assert [line["metadata"]["place"] for line in proxy.lines()] == [None]


def hello_world() -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"}]


def test_a_request_at_a_checkpoint_step_is_held_until_the_controller_releases_it(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    """``hold_every = 2``: step 2 waits, unanswered and unrecorded, while the controller (and only
    it) learns the step and releases it (``reroll run --checkpoint-every``)."""
    proxy = start_proxy(upstream_url=scripted_model.base_url, hold_every=2)
    controller = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        agent = pool.submit(converse, proxy.client(), TURNS, stream=False)
        status, _, held = http_json("GET", proxy.root_url + "/_reroll/held", headers=controller)
        assert (status, held["step"], held["frozen"]) == (200, 2, False)
        assert len(proxy.lines()) == 2 and not agent.done()
        release = "/_reroll/release?step="
        assert post_place(proxy, {}, {"Authorization": f"Bearer {TOKEN}"}, release + "2") == 403
        assert post_place(proxy, {}, controller, release + "1") == 404
        status, _, released = http_json("POST", proxy.root_url + release + "2", headers=controller)
        assert status == 200 and 0 < released["held_seconds"] < 30
        agent.result(timeout=30)
    assert [line["metadata"]["step"] for line in proxy.lines()] == [0, 1, 2]
