"""Cross-format live requests through the real proxy: an agent on the official SDK of one API, a
scripted upstream serving only the other (``--only-format``: a request left untranslated gets 404)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from reroll_contracts.errors import TranslationError
from reroll_contracts.wire import format_named
from reroll_proxy.translate import supported_pairs, translation_for

from tests.conftest import spawning
from tests.proxy.conftest import TOKEN, Service, StartProxy, http_json, start_service
from tests.proxy.sdk_agents import AGENTS
from tests.proxy.test_formats import SCRIPT, TURNS

PAIRS = [
    ("openai-chat", "anthropic-messages"),
    ("anthropic-messages", "openai-chat"),
    ("openai-responses", "openai-chat"),
    ("openai-responses", "anthropic-messages"),  # through Chat
    ("openai-chat", "openai-responses"),
    ("anthropic-messages", "openai-responses"),  # through Chat
]
CALL_ID_PREFIX = {"anthropic-messages": "toolu_", "openai-chat": "call_", "openai-responses": "call_"}
PATH = {
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "anthropic-messages": "/v1/messages",
}
OWN_KEY = {"openai-chat": "messages", "openai-responses": "input", "anthropic-messages": "system"}
"""A request key only that format has (Chat's system prompt is a message, Anthropic's is not)."""


@pytest.fixture(scope="module")
@spawning
def only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Service]]:
    """One scripted model per API format, each serving only that format."""
    workdir = tmp_path_factory.mktemp("translate-models")
    (workdir / "script.json").write_text(json.dumps(SCRIPT))
    services = {
        name: start_service(
            "reroll_proxy.scripted",
            ["--script", str(workdir / "script.json"), "--only-format", name],
            workdir,
            f"model-{name}",
        )
        for name in sorted({upstream for _, upstream in PAIRS})
    }
    yield services
    for service in services.values():
        service.stop()


def answer(name: str, final: dict[str, Any]) -> tuple[str, list[tuple[str, str, Any]]]:
    """(text, [(call id, tool name, parsed arguments)]) of a final object in format `name`."""
    if name == "openai-chat":
        message = final["choices"][0]["message"]
        calls = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []
        ]
        return message["content"] or "", calls
    if name == "openai-responses":
        output = final["output"]
        text = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
        called = [
            (i["call_id"], i["name"], json.loads(i["arguments"]))
            for i in output
            if i["type"] == "function_call"
        ]
        return text, called
    text = "".join(b["text"] for b in final["content"] if b["type"] == "text")
    return text, [(b["id"], b["name"], b["input"]) for b in final["content"] if b["type"] == "tool_use"]


def test_an_untranslated_request_is_refused_by_a_one_format_model(only: dict[str, Service]) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    url = only["anthropic-messages"].base_url + "/chat/completions"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=10)
    refused.value.close()
    assert refused.value.code == 404


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("agent_format", "upstream_format"), PAIRS, ids=lambda name: name.split("-")[-1])
async def test_tool_calls_round_trip_across_formats(
    start_proxy: StartProxy,
    only: dict[str, Service],
    agent_format: str,
    upstream_format: str,
    stream: bool,
    use_async: bool,
) -> None:
    proxy = start_proxy(
        upstream_url=only[upstream_format].base_url, model="live-model", upstream_format=upstream_format
    )
    agent = AGENTS[agent_format](proxy.base_url, TOKEN, use_async=use_async)
    transcript = await agent.run(TURNS, stream=stream)

    answers = [answer(agent_format, final) for final in transcript.finals]
    prefix = CALL_ID_PREFIX[upstream_format]  # the upstream's own call ids reach the agent
    assert answers[0] == (SCRIPT["turns"][0]["content"], [(f"{prefix}0_0", "bash", {"command": "ls -la"})])
    assert answers[1] == (
        "",
        [
            (f"{prefix}1_0", "bash", {"command": "cat notes.txt"}),
            (f"{prefix}1_1", "bash", {"command": "wc -l notes.txt"}),
        ],
    )
    assert answers[2] == ("Done. Everything is in order.", [])
    if stream:
        assert all(count > 3 for count in transcript.events)

    lines = proxy.lines()
    assert [line["metadata"]["api_format"] for line in lines] == [agent_format] * TURNS
    assert [line["metadata"]["upstream_format"] for line in lines] == [upstream_format] * TURNS
    assert [line["metadata"]["model"] for line in lines] == ["live-model"] * TURNS
    assert [line["metadata"]["stream"] for line in lines] == [stream] * TURNS
    # Recorded as the agent sent and received it: its own path, its own shapes.
    assert {line["request"]["path"] for line in lines} == {PATH[agent_format]}
    for line, final in zip(lines, transcript.finals, strict=True):
        assert answer(agent_format, line["response"]["body"]) == answer(agent_format, final)
        assert OWN_KEY[agent_format] in line["request"]["body"]

    # The translated recording replays like any other (no upstream at all).
    replayer = start_proxy(replay_path=proxy.trajectory_path)
    replayed = await AGENTS[agent_format](replayer.base_url, TOKEN, use_async=use_async).run(
        TURNS, stream=stream
    )
    assert [answer(agent_format, final) for final in replayed.finals] == answers
    assert replayer.status().divergences == []


def test_an_untranslatable_request_is_refused_with_its_cause(
    start_proxy: StartProxy, only: dict[str, Service]
) -> None:
    proxy = start_proxy(upstream_url=only["openai-responses"].base_url, upstream_format="openai-responses")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    code, _, answer_body = http_json(
        "POST", proxy.base_url + "/chat/completions", body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert code == 400
    message = answer_body["error"]["message"]
    assert "openai-chat → openai-responses" in message and "'n'" in message
    assert proxy.lines() == []  # refused before anything was served


@pytest.mark.parametrize("upstream", ["openai-chat", "anthropic-messages"])
def test_a_codex_shaped_request_sheds_what_the_upstream_cannot_hold_with_notes_in_metadata(
    start_proxy: StartProxy, only: dict[str, Service], upstream: str
) -> None:
    proxy = start_proxy(upstream_url=only[upstream].base_url, upstream_format=upstream)
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-opaque"},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {"type": "web_search", "external_web_access": True},
            {"type": "namespace", "name": "multi_agent_v1", "tools": []},
        ],
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
    }
    code, _, answer_body = http_json(
        "POST", proxy.base_url + "/responses", body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert code == 200, answer_body
    (line,) = proxy.lines()
    assert line["metadata"]["upstream_format"] == upstream
    assert line["metadata"]["translation_notes"] == [
        "dropped tool web_search: no Chat counterpart",
        "dropped tool namespace multi_agent_v1: no Chat counterpart",
        "dropped 1 reasoning item(s) (encrypted_content): no Chat counterpart",
        "dropped field include: no Chat counterpart",
        "dropped field reasoning: no Chat counterpart",
    ]
    assert line["request"]["body"] == body  # recorded as the agent sent it


def test_every_pair_is_routed_and_an_unknown_format_is_named() -> None:
    assert len(supported_pairs()) == 6  # three formats, each to each other
    with pytest.raises(
        TranslationError,
        match=r"for an openai-realtime upstream \(supported: .*openai-chat → openai-responses",
    ):
        translation_for(format_named("openai-chat"), "openai-realtime")
