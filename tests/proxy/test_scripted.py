"""The bundled scripted model as a real subprocess (``python -m reroll_proxy.scripted``, or in the
shared proxy's process), driven by the official openai SDK."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletion
from reroll.host.shared_process import MODE_ENV, PROXY_MODULE, PROXY_NAME, shared_process
from reroll.models.spec import ModelSpec, live_upstream
from reroll_contracts.errors import InfrastructureError, ModelError
from reroll_contracts.scripted_admin import SCRIPTS_ROUTE
from reroll_contracts.wire import format_named
from reroll_proxy.scripted import ModelScript, load_script, own_turns

from tests.conftest import spawning

SCRIPT = """
turns:
  - content: "I'll list the files."
    tool_calls:
      - name: bash
        arguments: {command: "ls -la"}
  - tool_calls:
      - name: bash
        arguments: {command: "cat a.txt"}
      - name: write_file
        arguments: '{"path": "b.txt"}'
    delay_seconds: 0.3
  - content: "Done: every file is listed, read and written."
threads:
  - name: title
    match: {without_tools: true, first_user: "(?i)^write a title"}
    turns: [{content: "Listing files"}]
"""


@pytest.fixture(params=["per-rollout", "shared"])
@spawning
async def client(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK against the script, served by a process of its own or by the shared server."""
    monkeypatch.setenv(MODE_ENV, request.param)
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    model = ModelSpec(spec=f"scripted:{script}", name="scripted", script=script)
    async with (
        live_upstream(model, tmp_path) as upstream,
        openai.AsyncOpenAI(base_url=upstream.base_url, api_key="any", max_retries=0) as sdk,
    ):
        yield sdk


@pytest.mark.spawns  # the shared proxy, which serves the scripts
async def test_one_shared_server_serves_each_script_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MODE_ENV, "shared")
    first, second, bad = tmp_path / "first.yaml", tmp_path / "second.yaml", tmp_path / "bad.yaml"
    first.write_text("turns: [{content: first script}]")
    second.write_text("turns: [{content: second script}]")
    bad.write_text("turns: [{not_a_field: 1}]")
    spec = {
        path: ModelSpec(spec=f"scripted:{path}", name="scripted", script=path)
        for path in (first, second, bad)
    }
    async with live_upstream(spec[first], tmp_path) as one, live_upstream(spec[second], tmp_path) as two:
        assert one.base_url.rsplit("/", 2)[0] == two.base_url.rsplit("/", 2)[0]  # one process
        answers = []
        for upstream in (one, two):
            async with openai.AsyncOpenAI(base_url=upstream.base_url, api_key="any", max_retries=0) as sdk:
                reply = await sdk.chat.completions.create(model="m", messages=conversation(0))
                answers.append(reply.choices[0].message.content)
        assert answers == ["first script", "second script"]
        with pytest.raises(InfrastructureError, match=str(bad)):
            async with live_upstream(spec[bad], tmp_path):
                pass
        proxy = await shared_process(PROXY_MODULE, PROXY_NAME)  # the one serving them
        control, root = proxy.address.removesuffix("/v1"), one.base_url.rsplit("/", 2)[0]
        async with aiohttp.ClientSession() as session:  # no admin token: nothing is added
            for where, status in ((control, 401), (root, 404)):  # the scripts' port has no admin route
                async with session.post(where + SCRIPTS_ROUTE, json={"script": str(first)}) as response:
                    assert response.status == status
            async with session.post(root + "/unknown/v1/chat/completions", json={"messages": []}) as response:
                assert response.status == 404


def function_calls(completion: ChatCompletion) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of the completion's function tool calls."""
    calls = completion.choices[0].message.tool_calls or []
    return [(c.id, c.function.name, c.function.arguments) for c in calls if c.type == "function"]


def conversation(assistant_turns: int) -> Any:
    """Messages holding `assistant_turns` assistant messages (typed Any: the SDK wants TypedDicts)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in range(assistant_turns):
        messages += [{"role": "assistant", "content": f"turn {turn}"}, {"role": "user", "content": "next"}]
    return messages


async def test_turn_is_chosen_by_the_assistant_message_count(client: openai.AsyncOpenAI) -> None:
    last = await client.chat.completions.create(model="my-model", messages=conversation(2))
    assert (last.id, last.created, last.model) == ("chatcmpl-scripted-2", 1_700_000_002, "my-model")
    assert last.choices[0].message.content == "Done: every file is listed, read and written."
    assert last.choices[0].finish_reason == "stop" and last.choices[0].message.tool_calls is None
    first = await client.chat.completions.create(model="my-model", messages=conversation(0))
    assert first.id == "chatcmpl-scripted-0" and first.choices[0].finish_reason == "tool_calls"
    assert function_calls(first) == [("call_0_0", "bash", '{"command":"ls -la"}')]
    assert (
        first.usage is not None
        and first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    )
    again = await client.chat.completions.create(model="my-model", messages=conversation(0))
    assert again.model_dump() == first.model_dump()


async def test_delay_and_tool_calls_without_content(client: openai.AsyncOpenAI) -> None:
    started = time.monotonic()
    second = await client.chat.completions.create(model="m", messages=conversation(1))
    assert time.monotonic() - started >= 0.3
    message = second.choices[0].message
    assert message.content is None
    assert function_calls(second) == [
        ("call_1_0", "bash", '{"command":"cat a.txt"}'),
        ("call_1_1", "write_file", '{"path": "b.txt"}'),
    ]


@pytest.mark.parametrize("turn", [0, 1, 2])
async def test_stream_matches_the_non_streamed_answer(client: openai.AsyncOpenAI, turn: int) -> None:
    whole = await client.chat.completions.create(model="m", messages=conversation(turn))
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            model="m",
            messages=conversation(turn),
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    assert len(chunks) > 3 and {c.id for c in chunks} == {whole.id}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = "".join(d.content or "" for d in deltas)
    assert content == (whole.choices[0].message.content or "")
    assert sum(1 for d in deltas if d.content) > 1 or not content
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.tool_calls or []:
            assert call.function is not None
            if call.index not in calls:
                assert call.id and call.function.name and not call.function.arguments
                calls[call.index] = [call.id, call.function.name, ""]
            else:
                assert call.id is None and call.function.name is None
                calls[call.index][2] += call.function.arguments or ""
    expected = [list(call) for call in function_calls(whole)]
    assert [calls[i] for i in sorted(calls)] == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


async def test_a_side_call_gets_its_thread_and_its_own_ids(client: openai.AsyncOpenAI) -> None:
    title = [{"role": "user", "content": "Write a title for: list the files"}]
    side = await client.chat.completions.create(model="m", messages=title)  # type: ignore[arg-type]
    main = await client.chat.completions.create(model="m", messages=conversation(0))
    assert side.choices[0].message.content == "Listing files" and side.id == "chatcmpl-scripted-title-0"
    assert main.choices[0].message.content == "I'll list the files." and main.id == "chatcmpl-scripted-0"
    with pytest.raises(openai.BadRequestError, match="turn 2 of 1 of thread 'title'"):
        await client.chat.completions.create(
            model="m",
            messages=[*title, {"role": "assistant", "content": "x"}, {"role": "user", "content": "again"}],  # type: ignore[list-item]
        )


async def test_exhausted_script_is_a_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="m", messages=conversation(3))
    assert "script exhausted: turn 4 of 3" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "turns: [content: x\n", "not valid YAML"),
        ("bad.json", '{"turns": [', "not valid JSON"),
        ("bad.yaml", "turns:\n  - content: hi\n    colour: red\n", "colour"),
        ("bad.yaml", "turns: []\n", "turns"),
        ("bad.yaml", "turns:\n  - errors: [{status: 200}]\n", "errors.0.status"),
        (
            "bad.yaml",
            "turns: [{}]\nthreads: [{name: t, match: {system: '(x'}, turns: [{}]}]\n",
            "not a regular",
        ),
        ("bad.yaml", "turns: [{}]\nthreads: [{name: T-1, match: {}, turns: [{}]}]\n", "threads.0.name"),
        ("missing.yaml", None, "cannot read"),
    ],
)
def test_bad_script_files_name_the_file(tmp_path: Path, name: str, text: str | None, expected: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ModelError, match=expected) as caught:
        load_script(path)
    assert str(path) in str(caught.value)


@pytest.mark.spawns
def test_bad_script_stops_the_server_with_exit_code_2(tmp_path: Path) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text("turns: 3\n")
    done = subprocess.run(
        [sys.executable, "-m", "reroll_proxy.scripted", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and str(script) in done.stderr


def test_the_bundled_example_scripts_load(examples: Path) -> None:
    for script in examples.glob("*/scripted-model*.yaml"):
        assert load_script(script).turns


BASH_TOOL = {"name": "Bash", "description": "run", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(
    ("body", "thread"),
    [
        ({"messages": [{"role": "user", "content": "fix it"}], "tools": [BASH_TOOL]}, ""),
        ({"system": "Summarise as a title", "messages": [{"role": "user", "content": "fix it"}]}, "title"),
        (
            {"messages": [{"role": "user", "content": "Explore: find the test"}], "tools": [BASH_TOOL]},
            "explore",
        ),
        ({"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "fix it"}]}, "small"),
        (
            {
                "messages": [
                    {"role": "user", "content": "Explore: find the test"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "a", "name": "Bash", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "a", "content": "OK-42"}],
                    },
                ],
                "tools": [BASH_TOOL],
            },
            "last",
        ),
    ],
)
def test_a_request_goes_to_the_first_thread_that_matches(body: dict[str, Any], thread: str) -> None:
    script = ModelScript.model_validate(
        {
            "turns": [{}],
            "threads": [
                {"name": "last", "match": {"last_message": "OK-\\d+"}, "turns": [{}]},
                {"name": "title", "match": {"without_tools": True, "system": "(?i)title"}, "turns": [{}]},
                {"name": "explore", "match": {"tools": ["Bash"], "first_user": "^Explore:"}, "turns": [{}]},
                {"name": "small", "match": {"model": "haiku"}, "turns": [{}]},
            ],
        }
    )
    normal = format_named("anthropic-messages").normalise(body)
    assert script.thread_for(normal, str(body.get("model", "")))[0] == thread


AIDER_FEW_SHOT = [
    {"role": "system", "content": "Act as an expert software developer. Use SEARCH/REPLACE blocks."},
    {"role": "user", "content": "Change get_factorial() to use math.factorial"},
    {"role": "assistant", "content": "mathweb/flask/app.py\n<<<<<<< SEARCH\n..."},
    {"role": "user", "content": "I switched to a new code base."},
    {"role": "assistant", "content": "Ok."},
]
"""The start of every main request aider sends (shortened): example exchanges of its own."""


def aider_request(*answers: str) -> dict[str, Any]:
    """An aider-shaped Chat request after the script's `answers` (each followed by aider's reply)."""
    messages = [*AIDER_FEW_SHOT, {"role": "user", "content": "The unit tests in test_calc.py fail."}]
    for answer in answers:
        messages += [
            {"role": "assistant", "content": answer + "\n"},  # aider may add whitespace
            {"role": "user", "content": "I added these files to the chat: calc.py"},
            {"role": "assistant", "content": "Ok, any changes I propose will be to those files."},
        ]
    return {"model": "scripted", "messages": messages, "stream": True}


@pytest.mark.parametrize("task", ["fix-failing-test", "hello-file"])
def test_aider_scripts_answer_aider_requests_turn_by_turn(examples: Path, task: str) -> None:
    script = load_script(examples / task / "scripted-model.aider.yaml")
    chat = format_named("openai-chat")
    answered: list[str] = []
    for turn in script.turns:
        normal = chat.normalise(aider_request(*answered))
        name, turns, count = script.thread_for(normal, "scripted")
        assert (name, count) == ("", "own")
        assert turns[own_turns(normal, turns)] is turn
        answered.append(turn.content or "")
    commit = chat.normalise(
        {"model": "scripted", "messages": [{"role": "system", "content": "Write a one-line commit message."}]}
    )
    name, turns, _ = script.thread_for(commit, "scripted")
    assert name == "commit" and own_turns(commit, turns) == 0


def test_own_count_ignores_assistant_messages_the_script_did_not_write() -> None:
    script = ModelScript.model_validate({"count": "own", "turns": [{"content": "A"}, {"content": "B"}]})
    normal = format_named("openai-chat").normalise(aider_request("A"))
    assert own_turns(normal, script.turns) == 1
