"""Every API format through the real proxy, driven by the official SDKs (sync and async, streamed
and not) in front of the real scripted model: record, replay, cutover, errors, pacing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.proxy.conftest import TOKEN, Service, StartProxy, start_service
from tests.proxy.sdk_agents import AGENTS, Transcript

pytestmark = pytest.mark.spawns  # every test runs the proxy and the scripted model as subprocesses

SCRIPT: dict[str, Any] = {
    "turns": [
        {
            "content": "I'll list the files.\nThen decide — naïvely? 🚀",
            "thinking": "Listing first is cheap.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}],
        },
        {
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "cat notes.txt"}},
                {"name": "bash", "arguments": {"command": "wc -l notes.txt"}},
            ]
        },
        {"content": "Done. Everything is in order."},
    ]
}
TURNS = len(SCRIPT["turns"])
COMBOS = [
    (name, use_async, stream) for name in AGENTS for use_async in (False, True) for stream in (False, True)
]


def combo_id(combo: tuple[str, bool, bool]) -> str:
    name, use_async, stream = combo
    return f"{name}-{'async' if use_async else 'sync'}-{'stream' if stream else 'json'}"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The scripted model serving `SCRIPT` in every format."""
    workdir = tmp_path_factory.mktemp("formats-model")
    (workdir / "script.json").write_text(json.dumps(SCRIPT))
    service = start_service(
        "reroll_proxy.scripted", ["--script", str(workdir / "script.json")], workdir, "model"
    )
    yield service
    service.stop()


def without_model(final: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in final.items() if key != "model"}


def texts(name: str, final: dict[str, Any]) -> tuple[str, list[str]]:
    """(the answer's text, the tool calls' JSON arguments), in any format."""
    if name == "openai-chat":
        message = final["choices"][0]["message"]
        return message["content"] or "", [c["function"]["arguments"] for c in message.get("tool_calls") or []]
    if name == "openai-responses":
        text = "".join(p["text"] for i in final["output"] if i["type"] == "message" for p in i["content"])
        return text, [i["arguments"] for i in final["output"] if i["type"] == "function_call"]
    text = "".join(b["text"] for b in final["content"] if b["type"] == "text")
    return text, [json.dumps(b["input"]) for b in final["content"] if b["type"] == "tool_use"]


@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
async def test_record_replay_and_cutover(
    start_proxy: StartProxy, model: Service, combo: tuple[str, bool, bool]
) -> None:
    name, use_async, stream = combo
    agent = AGENTS[name]

    recorder = start_proxy(upstream_url=model.base_url)
    recorded = await agent(recorder.base_url, TOKEN, use_async=use_async).run(TURNS, stream=stream)
    recorder.service.stop()
    lines = recorder.lines()
    assert [line["metadata"]["api_format"] for line in lines] == [name] * TURNS
    assert [line["metadata"]["stream"] for line in lines] == [stream] * TURNS
    for line, final in zip(lines, recorded.finals, strict=True):
        assert texts(name, line["response"]["body"]) == texts(name, final)
        events, offsets = line["response"]["events"], line["response"]["event_offsets_ms"]
        assert (events is None) is (not stream) and (offsets is None) is (not stream)
        if stream:
            assert len(offsets) == len(events) > 5 and offsets == sorted(offsets)
    first_text, first_calls = texts(name, recorded.finals[0])
    assert first_text == SCRIPT["turns"][0]["content"] and json.loads(first_calls[0]) == {"command": "ls -la"}
    assert texts(name, recorded.finals[2]) == ("Done. Everything is in order.", [])

    replayer = start_proxy(replay_path=recorder.trajectory_path)
    replayed = await agent(replayer.base_url, TOKEN, use_async=use_async).run(TURNS, stream=stream)
    assert replayed == recorded
    status = replayer.status()
    assert (status.served_replayed, status.served_live, status.divergences) == (TURNS, 0, [])
    replay_lines = replayer.lines()
    assert [line["response"]["events"] for line in replay_lines] == [
        line["response"]["events"] for line in lines
    ]
    assert [line["response"]["body"] for line in replay_lines] == [line["response"]["body"] for line in lines]

    cut = start_proxy(
        upstream_url=model.base_url, model="swapped-model", replay_path=recorder.trajectory_path, cut_index=1
    )
    continued = await agent(cut.base_url, TOKEN, use_async=use_async).run(TURNS, stream=stream)
    assert continued.finals[0] == recorded.finals[0]
    assert [without_model(final) for final in continued.finals] == [without_model(f) for f in recorded.finals]
    cut_lines = cut.lines()
    assert [line["metadata"]["source"] for line in cut_lines] == ["replayed", "live", "live"]
    assert [line["metadata"]["model"] for line in cut_lines] == ["gpt-test", "swapped-model", "swapped-model"]
    assert cut.status().divergences == []


@pytest.mark.parametrize("name", list(AGENTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_errors_are_recorded_and_replayed_in_place(
    tmp_path: Path, start_proxy: StartProxy, name: str, stream: bool
) -> None:
    script = {"turns": [{"content": "after two retries", "errors": [{"status": 500}, {"status": 429}]}]}
    (tmp_path / "flaky.json").write_text(json.dumps(script))
    flaky = start_service(
        "reroll_proxy.scripted", ["--script", str(tmp_path / "flaky.json")], tmp_path, "flaky"
    )
    try:
        recorder = start_proxy(upstream_url=flaky.base_url)
        agent = AGENTS[name]
        recorded = await agent(recorder.base_url, TOKEN, use_async=True, max_retries=2).run(1, stream=stream)
        assert texts(name, recorded.finals[0])[0] == "after two retries"
        lines = recorder.lines()
        assert [line["response"]["status_code"] for line in lines] == [500, 429, 200]
        error = lines[0]["response"]["body"]
        assert error["error"]["message"] == "scripted error"
        assert error.get("type") == ("error" if name == "anthropic-messages" else None)
        assert lines[1]["response"]["headers"]["retry-after-ms"] == "10"
    finally:
        flaky.stop()

    replayer = start_proxy(replay_path=recorder.trajectory_path)
    replayed = await agent(replayer.base_url, TOKEN, use_async=False, max_retries=2).run(1, stream=stream)
    assert replayed == recorded
    assert [line["response"]["status_code"] for line in replayer.lines()] == [500, 429, 200]
    assert replayer.status().served_replayed == 3 and replayer.status().divergences == []


def test_cutover_policy_goes_live_at_the_first_divergence(start_proxy: StartProxy, model: Service) -> None:
    recorder = start_proxy(upstream_url=model.base_url)
    run_sync(AGENTS["anthropic-messages"](recorder.base_url, TOKEN, use_async=False), stream=True)
    proxy = start_proxy(
        upstream_url=model.base_url,
        model="swapped-model",
        replay_path=recorder.trajectory_path,
        policy="cutover",
    )
    transcript = run_sync(
        AGENTS["anthropic-messages"](proxy.base_url, TOKEN, use_async=False), stream=True, task="Other task."
    )
    assert texts("anthropic-messages", transcript.finals[2])[0] == "Done. Everything is in order."
    status = proxy.status()
    assert (status.served_replayed, status.served_live, status.cutover_step) == (0, TURNS, 0)
    assert status.divergence_policy == "cutover" and status.stop is None
    (divergence,) = status.divergences
    assert (divergence.classification, divergence.field) == (
        "observation_changed",
        "messages[1].content[0].text",
    )
    lines = proxy.lines()
    assert [line["metadata"]["source"] for line in lines] == ["live"] * TURNS
    assert (
        lines[0]["metadata"]["divergence"]["step"] if False else lines[0]["metadata"]["divergence"]["field"]
    )


def test_replayed_stream_keeps_the_recorded_pace(
    start_proxy: StartProxy, model: Service, tmp_path: Path
) -> None:
    """A replay at timing factor 0.5 takes at least half the recorded 600 ms per turn (a lower
    bound: load cannot break it); factor 0 (no pauses) is tested in-process in test_respond."""
    recorder = start_proxy(upstream_url=model.base_url)
    run_sync(AGENTS["openai-responses"](recorder.base_url, TOKEN, use_async=False), stream=True)
    paced = tmp_path / "paced.jsonl"
    with paced.open("w") as out:
        for line in recorder.lines():
            count = len(line["response"]["events"])
            line["response"]["event_offsets_ms"] = [600 * i / (count - 1) for i in range(count)]
            out.write(json.dumps(line) + "\n")
    replayer = start_proxy(replay_path=paced, replay_timing_factor=0.5)
    started = time.monotonic()
    run_sync(AGENTS["openai-responses"](replayer.base_url, TOKEN, use_async=False), stream=True)
    assert time.monotonic() - started >= TURNS * 0.3


def run_sync(agent: Any, *, stream: bool, task: str = "List the files.") -> Transcript:
    """Run `agent` for every turn from synchronous code."""
    transcript: Transcript = asyncio.run(agent.run(TURNS, stream=stream, task=task))
    return transcript
