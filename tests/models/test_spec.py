"""Model specs."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from reroll.models.spec import (
    GEMINI_OPENAI_URL,
    live_upstream,
    model_name,
    parse_model,
    provider_of,
    resolved_spec,
    script_file,
)
from reroll_contracts.errors import ModelError


def test_a_scripted_path_is_stored_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s.yaml").write_text("turns: [{content: hi}]\n")
    monkeypatch.chdir(tmp_path)
    model = parse_model("scripted:s.yaml", None)
    assert model.spec == f"scripted:{tmp_path / 's.yaml'}" and model.script == tmp_path / "s.yaml"
    assert model.name == "scripted"


def test_a_spec_s_script_file_is_found_and_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an executor on another machine must carry for a model (`reroll.jobs.ray_executor`)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real.yaml").write_text("turns: []\n")
    (tmp_path / "link.yaml").symlink_to("real.yaml")
    assert script_file("scripted-chat:link.yaml") == tmp_path / "link.yaml"
    assert resolved_spec("scripted-chat:link.yaml") == f"scripted-chat:{tmp_path / 'real.yaml'}"
    for spec in ("scripted", "openai/gpt-4o", "anthropic/claude:latest"):
        assert script_file(spec) is None and resolved_spec(spec) == spec
    assert resolved_spec(None) is None


def test_the_task_script_keeps_its_short_spec(examples: Path) -> None:
    model = parse_model("scripted", examples / "fix-failing-test")
    assert model.spec == "scripted" and model.script == examples / "fix-failing-test" / "scripted-model.yaml"


@pytest.mark.parametrize(
    ("agent", "chosen"),
    [
        ("claude-code", "scripted-model.claude-code.yaml"),
        ("aider", "scripted-model.yaml"),
        (None, "scripted-model.yaml"),
    ],
)
def test_an_agent_gets_its_own_task_script_when_there_is_one(
    tmp_path: Path, agent: str | None, chosen: str
) -> None:
    for name in ("scripted-model.yaml", "scripted-model.claude-code.yaml"):
        (tmp_path / name).write_text("turns: [{content: hi}]\n")
    model = parse_model("scripted", tmp_path, agent)
    assert model.spec == "scripted" and model.script == tmp_path / chosen


def test_a_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"script file .*nope\.yaml not found"):
        parse_model(f"scripted:{tmp_path / 'nope.yaml'}", None)


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("scripted", "scripted"),
        ("scripted:/gone.yaml", "scripted"),
        ("openai/gpt-4o", "gpt-4o"),
        ("scripted-anthropic", "scripted"),
        ("scripted-anthropic:/gone.yaml", "scripted"),
        ("scripted-responses:/gone.yaml", "scripted"),
        ("openai-responses/gpt-5-pro", "gpt-5-pro"),
        ("anthropic/claude-x", "claude-x"),
        ("gemini-3", "gemini-3"),
    ],
)
def test_model_name_needs_no_provider(spec: str, name: str) -> None:
    assert model_name(spec) == name


def test_scripted_anthropic_speaks_only_anthropic_messages(examples: Path, tmp_path: Path) -> None:
    model = parse_model("scripted-anthropic", examples / "fix-failing-test")
    assert model.api_format == "anthropic-messages" and model.name == "scripted" and model.script is not None
    (tmp_path / "s.yaml").write_text("turns: [{content: hi}]\n")
    explicit = parse_model(f"scripted-anthropic:{tmp_path / 's.yaml'}", None)
    assert explicit.spec == f"scripted-anthropic:{tmp_path / 's.yaml'}"
    assert parse_model("scripted", examples / "fix-failing-test").api_format is None


def test_scripted_chat_speaks_only_chat_with_the_agents_script(examples: Path) -> None:
    model = parse_model("scripted-chat", examples / "fix-failing-test", "claude-code")
    assert model.api_format == "openai-chat" and model.name == "scripted"
    assert model.script == (examples / "fix-failing-test" / "scripted-model.claude-code.yaml").resolve()
    assert model_name("scripted-chat:/x.yaml") == "scripted"


@pytest.mark.spawns
async def test_responses_specs_speak_only_openai_responses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "s.yaml").write_text("turns: [{content: hi}]\n")
    model = parse_model(f"scripted-responses:{tmp_path / 's.yaml'}", None)
    assert model.api_format == "openai-responses" and model.name == "scripted"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with live_upstream(model, tmp_path) as upstream, aiohttp.ClientSession() as session:
        assert upstream.api_format == "openai-responses"
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.post(
            upstream.base_url + "/chat/completions", json=chat, timeout=timeout
        ) as refused:
            assert refused.status == 404
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    hosted = parse_model("openai-responses/gpt-5-pro", None)
    assert hosted.api_format == "openai-responses" and hosted.name == "gpt-5-pro"
    async with live_upstream(hosted, tmp_path) as upstream:
        assert upstream.api_format == "openai-responses" and upstream.model == "gpt-5-pro"
    assert parse_model("openai/gpt-4o", None).api_format is None


@pytest.mark.spawns
async def test_scripted_anthropic_serves_messages_only(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("turns: [{content: hi}]\n")
    model = parse_model(f"scripted-anthropic:{tmp_path / 's.yaml'}", None)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with live_upstream(model, tmp_path) as upstream, aiohttp.ClientSession() as session:
        assert upstream.api_format == "anthropic-messages"
        timeout = aiohttp.ClientTimeout(total=10)
        async with session.post(
            upstream.base_url + "/chat/completions", json=chat, timeout=timeout
        ) as refused:
            assert refused.status == 404
        async with session.post(upstream.base_url + "/messages", json=chat, timeout=timeout) as answered:
            assert answered.status == 200 and (await answered.json())["content"] == [
                {"type": "text", "text": "hi"}
            ]


async def test_anthropic_reads_its_key_and_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ModelError, match="needs ANTHROPIC_API_KEY"):  # refused when parsed
        parse_model("anthropic/claude-x", None)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    model = parse_model("anthropic/claude-x", None)
    assert model.api_format == "anthropic-messages" and model.name == "claude-x"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/")
    async with live_upstream(model, tmp_path) as upstream:
        assert (upstream.base_url, upstream.api_key, upstream.model) == (
            "http://127.0.0.1:9/v1",
            "sk-ant-test",
            "claude-x",
        )
        assert upstream.api_format == "anthropic-messages"


def test_a_missing_provider_key_is_refused_when_the_spec_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for spec in ("openai/gpt-4o", "openai-responses/gpt-5-pro"):
        with pytest.raises(ModelError, match=f"model '{spec}' needs OPENAI_API_KEY"):
            parse_model(spec, None)
    monkeypatch.setenv("REROLL_UPSTREAM_URL", "http://127.0.0.1:9/v1")  # its key is optional
    assert parse_model("openai/gpt-4o", None).name == "gpt-4o"


@pytest.mark.parametrize("spec", ["gemini/gemini-3.1-flash-lite-preview", "gemini-3.1-flash-lite-preview"])
async def test_gemini_goes_to_googles_openai_endpoint(
    spec: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``gemini/NAME`` and BenchFlow's bare ``gemini-…`` names: Chat over Google's endpoint."""
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_BASE_URL", raising=False)
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    with pytest.raises(ModelError, match=f"model '{spec}' needs GEMINI_API_KEY"):
        parse_model(spec, None)
    monkeypatch.setenv("GEMINI_API_KEY", "gm-test")
    model = parse_model(spec, None)
    assert (model.name, model.api_format) == ("gemini-3.1-flash-lite-preview", "openai-chat")
    async with live_upstream(model, tmp_path) as upstream:
        assert (upstream.base_url, upstream.api_key) == (GEMINI_OPENAI_URL, "gm-test")
    monkeypatch.setenv("GEMINI_BASE_URL", "http://127.0.0.1:9/v1")
    async with live_upstream(model, tmp_path) as upstream:
        assert upstream.base_url == "http://127.0.0.1:9/v1"


async def test_any_provider_with_a_base_url_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    monkeypatch.delenv("MY_LLM_BASE_URL", raising=False)
    with pytest.raises(ModelError, match=r"unknown provider 'my-llm'.*PROVIDER_BASE_URL"):
        parse_model("my-llm/big-1", None)
    monkeypatch.setenv("MY_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("MY_LLM_API_KEY", raising=False)
    model = parse_model("my-llm/big-1", None)  # the key is optional
    assert (model.name, model.api_format) == ("big-1", None)
    monkeypatch.setenv("MY_LLM_API_KEY", "k-1")
    async with live_upstream(model, tmp_path) as upstream:
        assert (upstream.base_url, upstream.api_key, upstream.model) == (
            "http://127.0.0.1:9/v1",
            "k-1",
            "big-1",
        )
    with pytest.raises(ModelError, match="unknown provider '\\(none\\)'"):
        parse_model("plain-name", None)


@pytest.mark.parametrize(
    ("spec", "provider", "variable", "api_format"),
    [
        ("claude-sonnet-4-6", "anthropic", "ANTHROPIC_API_KEY", "anthropic-messages"),
        ("gpt-4.1-mini", "openai", "OPENAI_API_KEY", None),
        ("o3-mini", "openai", "OPENAI_API_KEY", None),
        ("o4-mini", "openai", "OPENAI_API_KEY", None),
        ("gemini-3-pro", "gemini", "GEMINI_API_KEY", "openai-chat"),
    ],
)
def test_a_bare_benchflow_name_goes_to_the_provider_benchflow_picks(
    spec: str, provider: str, variable: str, api_format: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BenchFlow 0.7.11 routes a judge's bare name by its prefix; so do we, key and all."""
    for name in ("REROLL_UPSTREAM_URL", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert provider_of(spec) == provider
    with pytest.raises(ModelError, match=f"model '{spec}' needs {variable} in the environment"):
        parse_model(spec, None)
    monkeypatch.setenv(variable, "k-test")
    model = parse_model(spec, None)
    assert (model.spec, model.name, model.api_format) == (spec, spec, api_format)


def test_a_bare_claude_name_goes_to_the_upstream_server_when_one_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``REROLL_UPSTREAM_URL`` serves every bare name it served before (a litellm proxy's claude-…)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("REROLL_UPSTREAM_URL", "http://127.0.0.1:9/v1")
    assert provider_of("claude-sonnet-4-6") == ""
    assert parse_model("claude-sonnet-4-6", None).api_format is None
    assert provider_of("anthropic/claude-sonnet-4-6") == "anthropic"  # an explicit provider stays


def test_another_bare_name_has_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REROLL_UPSTREAM_URL", raising=False)
    assert provider_of("mistral-large") == ""
    with pytest.raises(ModelError, match=r"unknown provider '\(none\)'.*bare claude-/gpt-"):
        parse_model("mistral-large", None)
