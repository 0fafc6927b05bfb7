"""The agent registry: packaged declarations, ``$REROLL_AGENTS_FILE``, and bad declarations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.agents import AGENTS_FILE_ENV, get_agent, registry
from reroll.errors import AgentError


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    registry.cache_clear()
    yield
    registry.cache_clear()


def test_packaged_agents_use_base_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    assert get_agent("mini-swe-agent").proxy_mode == "base_url"


def test_agents_file_adds_an_intercepted_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "mine:\n  description: d\n  api_format: openai-chat\n  proxy_mode: intercept\n  launch: ./run\n"
    )
    monkeypatch.setenv(AGENTS_FILE_ENV, str(path))
    assert get_agent("mine").proxy_mode == "intercept"
    assert "mini-swe-agent" in registry()


def test_an_agent_declares_its_volatile_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "mine:\n  description: d\n  api_format: openai-chat\n  launch: ./run\n  volatile:\n"
        "    - path: client_metadata.session_id\n"
        "    - {pattern: 'Chunk ID: \\w+', label: chunk}\n"
    )
    monkeypatch.setenv(AGENTS_FILE_ENV, str(path))
    rules = get_agent("mine").volatile
    assert [(rule.path, rule.pattern, rule.label) for rule in rules] == [
        ("client_metadata.session_id", None, "volatile"),
        (None, r"Chunk ID: \w+", "chunk"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mine:\n  description: d\n  api_format: openai-chat\n  proxy_mode: mitm\n  launch: x\n", "mode"),
        (
            "mine:\n  description: d\n  api_format: openai-chat\n  launch: x\n  volatile: [{pattern: '('}]\n",
            "not a regular expression",
        ),
        ("- just a list\n", "expected a mapping"),
        ("mine: [unclosed\n", "invalid agent declaration"),
    ],
)
def test_bad_agents_file_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(text)
    monkeypatch.setenv(AGENTS_FILE_ENV, str(path))
    with pytest.raises(AgentError, match=message) as caught:
        registry()
    assert str(path) in str(caught.value)


def test_missing_agents_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AGENTS_FILE_ENV, str(tmp_path / "absent.yaml"))
    with pytest.raises(AgentError, match=r"absent\.yaml"):
        registry()


def test_an_anthropic_agent_gets_the_proxy_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(
        "claude:\n  description: d\n  api_format: anthropic-messages\n  launch: ./run\n"
        "  env: {ANTHROPIC_BASE_URL: '{proxy_url}', OPENAI_BASE_URL: '{base_url}', KEY: '{api_key}'}\n"
    )
    monkeypatch.setenv(AGENTS_FILE_ENV, str(path))
    env = get_agent("claude").launch_env(base_url="http://127.0.0.1:9/v1", api_key="tok", model="m")
    assert env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "KEY": "tok",
    }


def test_an_unknown_agent_says_how_to_declare_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    with pytest.raises(AgentError, match=f"unknown agent 'nobody'.*mini-swe-agent.*{AGENTS_FILE_ENV}"):
        get_agent("nobody")
