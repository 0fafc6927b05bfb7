"""The rollout lifecycle with real parts: an agent on the official ``openai`` SDK in the `local`
sandbox, the LLM proxy and the sidecar as real subprocesses of ``reroll``.

``continue --replay-only`` stops at the cut point: status ``timeout`` / ``replay_only``, exit
code 0, no verifier run — whether the agent exits the instant it gets the cut-point 409 or
carries on. When the controller learnt the cut point by polling the proxy (every 0.25 s), an
agent that exits at once usually did so between two polls, and the rollout ended as an agent
error (exit 1) with the verifier run; an agent that carries on is stopped by the proxy's push.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.rollout import lifecycle as rollout

from tests.runfolder.test_run import exchange_line, make_run_folder

pytestmark = pytest.mark.spawns  # real rollouts: reroll, sidecar, proxy and agent processes
REROLL = str(Path(sys.executable).parent / "reroll")
AGENT = """
import json, os, sys, time, urllib.error, urllib.request

url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"  # the rollout's proxy
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
messages = [{"role": "user", "content": open(os.environ["REROLL_PROMPT_FILE"]).read()}]
while True:
    body = json.dumps({"model": os.environ["REROLL_MODEL"], "messages": messages}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as response:
            reply = json.load(response)
    except urllib.error.HTTPError as exc:
        print(f"refused: HTTP {exc.code}", flush=True)
        if os.environ["ON_REFUSAL"] == "exit":
            os._exit(3)  # at once: no cleanup
        time.sleep(3600)  # carries on: only the controller can stop it
    messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "go on"}]
"""


def agents_file(path: Path) -> Path:
    """Declare the agent above (the sandbox's ``python3``, standard library only) as ``exit`` and ``hang``,
    after what it does when a request is refused; return `path`."""
    agents = {
        name: {
            "description": f"openai SDK loop; on a refused request: {name}",
            "api_format": "openai-chat",
            "install": f"cat > \"$REROLL_AGENT_HOME/agent.py\" <<'EOF'\n{AGENT}\nEOF\n",
            "launch": 'python3 "$REROLL_AGENT_HOME/agent.py"',
            "env": {
                "OPENAI_BASE_URL": "{base_url}",
                "OPENAI_API_KEY": "{api_key}",
                "REROLL_MODEL": "{model}",
                "ON_REFUSAL": name,
            },
        }
        for name in ("exit", "hang")
    }
    path.write_text(yaml.safe_dump(agents))
    return path


def continue_run(tmp_path: Path, examples: Path, agent: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``reroll continue FLAGS`` into ``rebuilt/`` of a timed-out two-exchange hello-file run by `agent`."""
    run = make_run_folder(tmp_path / "jobs" / "recorded" / "run", [exchange_line(0), exchange_line(1)])
    config = {"task_path": str(examples / "hello-file"), "agent": agent, "model": "scripted"}
    (run / "config.json").write_text(json.dumps(config))
    (run / "result.json").write_text(json.dumps({"status": "timeout", "error_category": "timeout"}))
    return subprocess.run(
        [REROLL, "continue", str(run), *flags, "--output", "rebuilt", "--timeout", "300"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env={**os.environ, "REROLL_AGENTS_FILE": str(agents_file(tmp_path / "agents.yaml"))},
    )


def rebuilt_result(tmp_path: Path) -> dict[str, Any]:
    """The rebuilt run's result.json, after checking that its verifier did not run."""
    (rebuilt,) = (tmp_path / "rebuilt").iterdir()
    result: dict[str, Any] = json.loads((rebuilt / "result.json").read_text())
    assert result["rewards"] is None and result["timings"]["verifier_seconds"] is None, result
    assert not any((rebuilt / "verifier").glob("*")), "the verifier ran"
    return result


@pytest.mark.parametrize("on_refusal", ["exit", "hang"])
def test_replay_only_stops_at_the_cut(tmp_path: Path, examples: Path, on_refusal: str) -> None:
    done = continue_run(tmp_path, examples, on_refusal, "--replay-only")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "status:  timeout" in done.stdout
    result = rebuilt_result(tmp_path)
    assert (result["status"], result["error_category"]) == ("timeout", "replay_only"), result
    assert result["error"] == "replay-only: stopped at the cut point after 2 replayed exchanges"
    assert result["counts"] == {"exchanges": 2, "replayed": 2, "live": 0, "divergences": 2, "tokens": 0}


def test_strict_divergence_aborts_even_when_the_agent_exits_at_once(tmp_path: Path, examples: Path) -> None:
    done = continue_run(tmp_path, examples, "exit", "--strict-divergence")
    assert done.returncode == 1, done.stdout + done.stderr
    result = rebuilt_result(tmp_path)
    assert (result["status"], result["error_category"]) == ("error", "divergence"), result
    assert result["error"].startswith("strict divergence: step 0: ")
    assert result["counts"]["exchanges"] == 0


def test_an_agent_that_fails_before_verification_is_the_headline_not_the_verifier(tmp_path: Path) -> None:
    """oracle's solve.sh imports a missing module; the verifier then finds no reward. The status
    line and result.json name the agent's failure (with its last output) first."""
    task = tmp_path / "agent-fails"
    (task / "oracle").mkdir(parents=True)
    (task / "verifier").mkdir()
    (task / "task.md").write_text("---\nname: agent-fails\n---\nNothing to do.\n")
    (task / "oracle" / "solve.sh").write_text("#!/bin/sh\nexec python3 -c 'import reroll_no_such_module'\n")
    (task / "verifier" / "test.sh").write_text("#!/bin/sh\necho 'no reward written'\n")
    done = subprocess.run(
        [REROLL, "run", str(task), "--agent", "oracle", "--job-name", "h"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "jobs" / "h").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["status"], result["error_category"]) == ("error", "agent_error"), result
    assert result["error"].startswith("agent exited with code 1: "), result["error"]
    assert "No module named 'reroll_no_such_module'" in result["error"].split("; then: ")[0]
    assert "; then: " in result["error"] and "reward" in result["error"].split("; then: ")[1]
    status_line = next(line for line in done.stdout.splitlines() if line.startswith("status:"))
    assert "agent exited with code 1" in status_line, done.stdout


def test_headline_puts_the_agent_first() -> None:
    assert rollout.headline("agent exited with code 2", "verifier: no reward\ntest output:\n...") == (
        "agent exited with code 2; then: verifier: no reward"
    )


def test_the_host_interpreter_leads_path_only_where_the_sandbox_is_a_host_folder() -> None:
    """In a container the host's bin folder (pyenv's under /root, unsearchable for the agent's
    user) would turn every lookup of a missing program into EACCES: OpenHands crashed on it."""
    from types import SimpleNamespace

    from reroll.sandbox.layout import SandboxLayout

    def path(root: str) -> list[str]:
        layout = SandboxLayout(
            root=root, workspace=f"{root}/app", logs_dir="/logs", home="/h", agents_dir="/a"
        )
        return rollout.sandbox_env(SimpleNamespace(layout=layout))["PATH"].split(":")  # type: ignore[arg-type]

    host_bin = str(Path(sys.base_prefix) / "bin")
    assert path("/tmp/reroll-local-x")[0] == host_bin
    container = path("/")
    assert host_bin not in container and container[-1] == "/bin"
