"""Claude Code end to end with real parts: the `claude` CLI from the claude-agent-sdk wheel
(installed unmodified from PyPI, once per machine into the agent cache / docker volume), the
sidecar, the LLM proxy and the bundled scripted model (its script for Claude Code's own tools),
once in the `local` sandbox and once in `docker`.

Per sandbox (`tests.agents.e2e`): a recording cut by its timeout → `reroll continue` to reward
1.0 → `reroll replay` matches every step with the same workspace, serving each from the recording
in order → a tampered observation is caught at its step and field. Then (local only) two
background subagents (the `Agent` tool): recorded once, replayed ten times, every request served
its own thread's answer whatever the order in which the concurrent requests arrived.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.agents.e2e import *  # noqa: F403 (the shared fixtures and tests)
from tests.agents.e2e import TASK, record_until_cut
from tests.agents.subagents import SUBAGENTS_SCRIPT, answered_by, thread_of
from tests.conftest import labelled_containers
from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

EXAMPLES = TASK.parent
AGENT = "claude-code"
REPLAYS = 10
pytestmark = [pytest.mark.slow, pytest.mark.spawns, pytest.mark.timeout(900)]  # set-up installs the agent


@pytest.fixture(scope="module")
def recorded(workdir: Path, sandbox_backend: str) -> Path:
    """A recorded Claude Code run cut by its step limit after two exchanges (Read, Bash)."""
    return record_until_cut(workdir, sandbox_backend, AGENT, cut=2)


def test_recorded_run_is_cut_with_its_exchanges(recorded: Path) -> None:
    result = read_json(recorded / "result.json")
    assert result["status"] == "timeout" and result["error_category"] == "step_limit"
    lines = trajectory(recorded)
    assert len(lines) == 2 == result["counts"]["live"]
    assert {line["request"]["path"] for line in lines} == {"/v1/messages?beta=true"}
    assert all(line["metadata"]["api_format"] == "anthropic-messages" for line in lines)
    first = lines[0]["request"]
    assert first["body"]["stream"] is True and first["body"]["model"] == "scripted"
    # the `role: system` message with the cwd and the date, which the volatile rules cover
    assert any(m["role"] == "system" for m in first["body"]["messages"])
    assert not {"x-api-key", "authorization"} & {k.lower() for k in first["headers"]}
    assert not labelled_containers(recorded.name)


def test_continue_finishes_with_reward_one(continued: Path) -> None:
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    sources = [line["metadata"]["source"] for line in trajectory(continued)]
    assert sources == ["replayed", "replayed", "live", "live", "live"]
    assert result["counts"]["divergences"] == 0


def test_continue_by_a_chat_only_model(recorded: Path, workdir: Path, sandbox_backend: str) -> None:
    """Claude Code (Anthropic Messages) continued by a model served over Chat Completions only:
    the proxy translates, leaves out what Chat cannot hold and notes it, never a 400."""
    if sandbox_backend != "local":
        pytest.skip("the translation does not depend on the sandbox: checked once, on local")
    done = reroll(
        "continue", str(recorded), "--model", "scripted-chat", "--timeout", "120", "--output", "chat",
        cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    continued = only_folder(workdir / "chat")
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    live = [line for line in trajectory(continued) if line["metadata"]["source"] == "live"]
    assert len(live) == 3 and all(line["response"]["status_code"] == 200 for line in live)
    for line in live:
        metadata = line["metadata"]
        assert metadata["api_format"] == "anthropic-messages" and metadata["upstream_format"] == "openai-chat"
        assert "field thinking" in metadata["translation_notes"] and any(
            n.startswith("betas ") for n in metadata["translation_notes"]
        )


@pytest.mark.parametrize("sandbox_backend", ["local"], indirect=True)
def test_two_background_subagents_replay_to_their_own_threads(sandbox_backend: str, tmp_path: Path) -> None:
    """Recorded once, replayed ten times by the proxy with the agent run directly (no sandbox:
    ten rollouts would cost minutes): every request, whatever the order the concurrent ones
    arrived in, is served the next answer of its own thread. The notifications of the subagents'
    ends reach the main conversation one by one or together, so its request count varies by one
    between runs: a request past its thread's recording goes live to the same script (as in
    `reroll continue`), and gets its own thread's answer there too."""
    from tests.proxy.conftest import start_service

    script = tmp_path / "subagents.yaml"
    script.write_text(yaml.safe_dump(SUBAGENTS_SCRIPT))
    done = reroll(
        "run", str(EXAMPLES / "hello-file"), "--agent", AGENT, "--model", f"scripted:{script}",
        "--timeout", "120", "--jobs-dir", "jobs", "--job-name", "subagents", "--sandbox", sandbox_backend,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded_run = only_folder(tmp_path / "jobs" / "subagents")
    assert read_json(recorded_run / "result.json")["rewards"] == {"reward": 1.0}
    recorded = trajectory(recorded_run)
    assert {thread_of(line["request"]["body"]) for line in recorded} == {"", "alpha", "beta"}
    threads_recorded = {line["metadata"]["thread"] for line in recorded}
    assert len(threads_recorded) >= 3  # main, alpha, beta (and any side call)

    model = start_service("reroll_proxy.scripted", ["--script", str(script)], tmp_path, "model")
    orders, divergent, live = [], 0, 0
    try:
        for replay in range(REPLAYS):
            lines = replay_directly(recorded_run, tmp_path / f"replay-{replay}", model.base_url)
            for line in lines:
                request, metadata = line["request"]["body"], line["metadata"]
                thread, turn = answered_by(line["response"]["body"])
                assert thread == thread_of(request), (replay, metadata["step"], thread)
                assert turn == sum(m["role"] == "assistant" for m in request["messages"])
                if metadata["source"] == "replayed":
                    # the thread the proxy names is the recorded exchange's thread
                    assert metadata["thread"] == recorded[metadata["replayed_from"]]["metadata"]["thread"]
                else:
                    assert thread == "" and turn >= 2, "only the main thread's last turns may go live"
                divergent += metadata.get("divergence") is not None
                live += metadata["source"] == "live"
            orders.append("".join(thread_of(line["request"]["body"])[:1] or "m" for line in lines))
    finally:
        model.stop()
    print(f"arrival orders over {REPLAYS} replays (m main, a alpha, b beta): {sorted(set(orders))}")
    print(
        f"divergent requests (notifications in another order): {divergent}; live (one more main turn): {live}"
    )


def replay_directly(recorded_run: Path, workdir: Path, upstream: str) -> list[dict[str, Any]]:
    """Claude Code run directly (no sandbox) on a fresh copy of hello-file's workspace in `workdir`,
    through a replay proxy of `recorded_run`'s recording that forwards past it to `upstream`;
    checks that the agent wrote both subagents' files. Returns the proxy's trajectory lines."""
    from reroll.agents import get_agent
    from reroll.cache import cache_dir
    from reroll.host.llm_proxy import recorded_sandbox_values
    from reroll_contracts.proxy import ProxyConfig, ReplayConfig, UpstreamConfig, VolatileRule

    from tests.proxy.conftest import TOKEN, start_service

    agent = get_agent(AGENT)
    workspace, agent_home = workdir / "app", workdir / "home"
    shutil.copytree(EXAMPLES / "hello-file" / "environment" / "workspace", workspace)
    agent_home.mkdir()
    volatile = [
        VolatileRule(value=str(workspace), label="workspace"),
        VolatileRule(value=str(agent_home), label="home"),
        *recorded_sandbox_values(recorded_run),
        *agent.volatile,
    ]
    config = ProxyConfig(
        token=TOKEN,
        trajectory_path=workdir / "trajectory.jsonl",
        replay=ReplayConfig(trajectory_path=recorded_run / "trajectory" / "llm_trajectory.jsonl"),
        volatile=volatile,
        upstream=UpstreamConfig(base_url=upstream),
    )
    (workdir / "proxy.json").write_text(config.model_dump_json())
    proxy = start_service("reroll_proxy", ["--config", str(workdir / "proxy.json")], workdir, "proxy")
    prompt = workdir / "prompt.txt"
    prompt.write_text(json.loads((recorded_run / "prompts.json").read_text())[0])
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(agent_home),
        "REROLL_AGENT_HOME": str(cache_dir() / "agents" / agent.install_key),
        "REROLL_PROMPT_FILE": str(prompt),
        **agent.launch_env(base_url=proxy.base_url, api_key=TOKEN, model="scripted"),
    }
    try:
        launch = ["sh", "-c", agent.launch]
        ran = subprocess.run(launch, cwd=workspace, env=env, capture_output=True, timeout=120)
    finally:
        proxy.stop()
    lines = [json.loads(line) for line in (workdir / "trajectory.jsonl").read_text().splitlines()]
    assert ran.returncode == 0, ran.stderr.decode()[-2000:]
    assert (workspace / "alpha.txt").read_text() == "alpha\n" and (workspace / "beta.txt").is_file()
    return lines
