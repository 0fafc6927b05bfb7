"""A rollout of an agent with the provider's URL hard-coded (``proxy_mode: intercept``), end to
end with real parts: recorded through mitmdump → the LLM proxy → the scripted model, cut by its
timeout, then continued (replay through the interceptor, then live) to reward 1, in the `local`
sandbox and in a docker container; the task's network policy is ``none``, so the agent's try to
reach another host is refused by the interceptor.

The agent (declared in a file named by ``$REROLL_AGENTS_FILE``) uses only Python's urllib, which
reads ``https_proxy`` and, through OpenSSL, ``SSL_CERT_FILE``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import labelled_containers
from tests.e2e.test_main_job import REROLL, TASK, only_folder, read_json, trajectory

pytestmark = pytest.mark.slow
AGENT = r"""
import json, os, subprocess, sys, urllib.request

URL = "https://api.openai.com/v1/chat/completions"  # hard-coded: no base-URL variable is read
try:
    urllib.request.urlopen("https://pypi.org/simple/", timeout=20)
    print("egress: open", flush=True)
except Exception as exc:
    print(f"egress: {exc}", flush=True)
tool = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}
messages = [{"role": "system", "content": "You fix code with the bash tool."},
            {"role": "user", "content": open(os.environ["REROLL_PROMPT_FILE"]).read()}]
for _ in range(20):
    body = {"model": os.environ["REROLL_MODEL"], "messages": messages, "tools": [tool]}
    request = urllib.request.Request(URL, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": "Bearer sk-hard-coded"})
    with urllib.request.urlopen(request, timeout=3600) as response:
        message = json.load(response)["choices"][0]["message"]
    messages.append({"role": "assistant", "content": message["content"],
                     "tool_calls": message.get("tool_calls") or None})
    for call in message.get("tool_calls") or []:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        output = done.stdout + done.stderr
        print(f"$ {command}\n{output}", flush=True)
        if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in output:
            sys.exit(0)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
sys.exit(1)
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sandbox_backend: str) -> Path:
    workdir = tmp_path_factory.mktemp(f"intercept-{sandbox_backend}")
    agents = {
        "hard-coded-openai": {
            "description": "urllib agent calling https://api.openai.com directly",
            "api_format": "openai-chat",
            "proxy_mode": "intercept",
            "install": f"cat > \"$REROLL_AGENT_HOME/agent.py\" <<'EOF'\n{AGENT}\nEOF\n",
            "launch": 'python3 "$REROLL_AGENT_HOME/agent.py"',
            "env": {"REROLL_MODEL": "{model}"},
        }
    }
    (workdir / "agents.yaml").write_text(yaml.safe_dump(agents))
    return workdir


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REROLL_AGENTS_FILE": str(cwd / "agents.yaml")}
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=900, env=env)
    print(done.stdout, done.stderr, sep="\n")
    return done


@pytest.fixture(scope="module")
def cut_run(workdir: Path, sandbox_backend: str) -> Path:
    done = reroll(
        "run", str(TASK), "--agent", "hard-coded-openai",
        "--model", f"scripted:{TASK / 'scripted-model.yaml'}",
        "--max-steps", "2", "--jobs-dir", "jobs", "--job-name", "record",
        "--sandbox", sandbox_backend, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return only_folder(workdir / "jobs" / "record")


def test_intercepted_run_is_recorded(cut_run: Path) -> None:
    result = read_json(cut_run / "result.json")
    assert result["status"] == "timeout", result
    lines = trajectory(cut_run)
    assert [line["metadata"]["source"] for line in lines] == ["live", "live"]
    assert [line["request"]["path"] for line in lines] == ["/v1/chat/completions"] * 2
    assert "sk-hard-coded" not in (cut_run / "trajectory" / "llm_trajectory.jsonl").read_text()
    output = (cut_run / "agent" / "output.log").read_text()
    assert "egress: <urlopen error Tunnel connection failed: 403" in output, output
    assert "$ cat calc.py" in output
    assert not labelled_containers(cut_run.name)


def test_intercepted_run_continues_to_reward_one(cut_run: Path, workdir: Path) -> None:
    done = reroll("continue", str(cut_run), "--model", "scripted", "--timeout", "120", cwd=workdir)
    assert done.returncode == 0, done.stderr
    continued = only_folder(cut_run.parent / "continued")
    result = read_json(continued / "result.json")
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    lines = trajectory(continued)
    assert [line["metadata"]["source"] for line in lines] == ["replayed", "replayed", "live", "live", "live"]
    for replayed, recorded in zip(lines[:2], trajectory(cut_run), strict=False):
        assert replayed["response"]["body"] == recorded["response"]["body"]
    assert result["counts"]["divergences"] == 0
    assert json.loads((continued / "config.json").read_text())["agent"] == "hard-coded-openai"
