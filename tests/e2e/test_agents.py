"""The agent registry: packaged declarations, ``$REROLL_AGENTS_FILE``, and bad declarations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.agents import AGENTS_FILE_ENV, UV_REQUIREMENT, get_agent, registry
from reroll_contracts.errors import AgentError


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
        (
            "mine:\n  description: d\n  api_format: openai-chat\n  launch: x\n  pip: [tool==1]\n",
            "python version",
        ),
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


def claude_code_request(run: dict[str, str]) -> dict[str, object]:
    """A Claude Code request in the shape the CLI sends, with one run's volatile values."""
    environment = (
        f"# Environment\n - Primary working directory: /app\n - OS Version: {run['os']}\n"
        f"memory at `/home/agent/.claude/projects/{run['slug']}/memory/`\n"
        f"Today's date is {run['date']}."
    )
    notification = (
        f"agentId: {run['agent']} (internal ID)\n"
        f"output_file: /tmp/claude-0/{run['slug']}/{run['session']}/tasks/{run['agent']}.output\n"
        f"<usage><subagent_tokens>{run['tokens']}</subagent_tokens></usage>"
    )
    return {
        "system": [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.327.{run['cc']};"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the test."}]},
            {"role": "system", "content": environment},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": notification}],
            },
        ],
        "metadata": {"user_id": f'{{"device_id":"{run["agent"]}","session_id":"{run["session"]}"}}'},
    }


def test_claude_codes_volatile_parts_are_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs' requests differ only where the declaration says; anything else still differs."""
    from reroll_proxy.volatile import Volatility

    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    registry.cache_clear()
    volatility = Volatility(get_agent("claude-code").volatile)
    first = {
        "os": "Linux 6.18.44-fc", "slug": "-tmp-a-app", "date": "2026-11-23", "agent": "a968774365cde25a5",
        "session": "d1880b95-ab55-4537-a975-5b782566d368", "tokens": "3255", "cc": "17f",
    }  # fmt: skip
    second = {
        "os": "Linux 6.1.0-13", "slug": "-tmp-b-app", "date": "2026-11-24", "agent": "ad149a8d70f692e94",
        "session": "0f3dc32f-65b4-45ce-aeb3-f7d083dee4a9", "tokens": "3301", "cc": "644",
    }  # fmt: skip
    assert claude_code_request(first) != claude_code_request(second)
    assert volatility.apply(claude_code_request(first)) == volatility.apply(claude_code_request(second))
    tampered = claude_code_request(second)
    tampered["messages"][0]["content"][0]["text"] = "Break the test."  # type: ignore[index]
    assert volatility.apply(claude_code_request(first)) != volatility.apply(tampered)


def system_prompt_of(agent: str, text: str) -> str:
    """`text` as a system message of `agent`'s request after its declared volatile rules."""
    from reroll_proxy.volatile import Volatility

    body = {"messages": [{"role": "system", "content": text}]}
    return str(Volatility(get_agent(agent).volatile).apply(body)["messages"][0]["content"])


def test_aider_date_and_platform_are_volatile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    recorded = (
        "- Platform: Linux-6.1-x86_64-with-glibc2.36\n- Shell: SHELL=None\n- Current date: 2026-11-23\n"
    )
    replayed = (
        "- Platform: Linux-6.8-x86_64-with-glibc2.41\n- Shell: SHELL=None\n- Current date: 2026-11-24\n"
    )
    assert system_prompt_of("aider", recorded) == system_prompt_of("aider", replayed)
    assert "SHELL=None" in system_prompt_of("aider", recorded)  # nothing else is dropped
    assert get_agent("aider").volatile_files == [".git/index", ".aider.tags.cache.v4/*"]


def test_openhands_datetime_with_microseconds_is_volatile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    recorded = system_prompt_of("openhands", "The current date and time is: 2026-11-23T22:45:01.123456")
    assert recorded == system_prompt_of(
        "openhands", "The current date and time is: 2026-11-24 08:00:59.000001"
    )
    assert recorded.endswith("<datetime>")
    assert system_prompt_of("openhands", "version 2026-11-23") == "version 2026-11-23"  # a date alone is kept


def test_every_pip_installed_agent_asks_for_a_python_and_the_version_is_part_of_its_install_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No install makes its venv with the task image's python3 (issue 29, defect 7)."""
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    for name in ("mini-swe-agent", "codex", "claude-code", "aider", "openhands"):
        agent = get_agent(name)
        assert agent.python == "3.12" and '"$REROLL_PYTHON" -m venv' in (agent.install_script or ""), name
        assert "python3 " not in (agent.install_script or ""), name
    openhands = get_agent("openhands")
    assert openhands.model_copy(update={"python": "3.13"}).install_key != openhands.install_key


def test_pip_requirements_install_with_uv_into_a_venv_before_the_install_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agents.yaml"
    declaration = "  description: d\n  api_format: openai-chat\n  launch: x\n  python: '3.12'\n"
    path.write_text(f"mine:\n{declaration}  pip: [--no-deps, 'tool==1']\n  install: tool --version\n")
    monkeypatch.setenv(AGENTS_FILE_ENV, str(path))
    script = (get_agent("mine").install_script or "").splitlines()
    assert script[0] == '"$REROLL_PYTHON" -m venv "$REROLL_AGENT_HOME/venv"'
    assert script[1].endswith(f"install --quiet --disable-pip-version-check {UV_REQUIREMENT}")
    assert (
        script[2].startswith('"$REROLL_AGENT_HOME/venv/bin/uv" pip install')
        and "--compile-bytecode" in script[2]
    )
    assert script[2].endswith("--no-deps tool==1") and script[3:] == ["tool --version"]
    first = get_agent("mine").install_key
    path.write_text(f"mine:\n{declaration}  pip: ['tool==2']\n")
    registry.cache_clear()
    assert get_agent("mine").install_script.endswith(" tool==2")  # type: ignore[union-attr]
    assert get_agent("mine").install_key != first


def test_openhands_pty_echo_is_volatile_but_the_output_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways seen in docker for the same `cat calc.py` step (recorded, then continued)."""
    monkeypatch.delenv(AGENTS_FILE_ENV, raising=False)
    echoed = system_prompt_of(
        "openhands", '\x1b[?2004l\x1b[?2004h\n\ncat calc.py\n\x1b[?2004l"""A tiny calculator."""'
    )
    assert echoed == system_prompt_of("openhands", '\x1b[?2004l"""A tiny calculator."""')
    assert echoed == '<pty-echo>"""A tiny calculator."""'
    assert system_prompt_of("openhands", '\x1b[?2004l"""A tiny median."""') != echoed
