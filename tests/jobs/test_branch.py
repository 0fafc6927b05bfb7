"""``branch`` runs its branches on the job runner: retries of infrastructure failures, folders
named by `model_slug`, the summary tree."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from reroll.agents import AGENTS_FILE_ENV, registry
from reroll.jobs.branch import branch
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import model_slug
from reroll.rollout.start import RolloutOptions
from reroll.sandbox import base

from tests.jobs import flaky_sandbox
from tests.runfolder.test_run import exchange_line, make_run_folder

AGENT = r"""
import json, os, subprocess, sys, urllib.request

tool = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}
messages = [{"role": "user", "content": open(os.environ["REROLL_PROMPT_FILE"]).read()}]
for _ in range(10):
    body = {"model": os.environ["REROLL_MODEL"], "messages": messages, "tools": [tool]}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json",
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=600) as response:
        message = json.load(response)["choices"][0]["message"]
    messages.append({"role": "assistant", "content": message["content"],
                     "tool_calls": message.get("tool_calls") or None})
    for call in message.get("tool_calls") or []:
        command = json.loads(call["function"]["arguments"])["command"]
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
        if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in output:
            sys.exit(0)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
sys.exit(1)
"""


URLLIB_AGENTS = {
    "urllib-chat": {
        "description": "urllib Chat Completions agent (tests)",
        "api_format": "openai-chat",
        "install": f"cat > \"$REROLL_AGENT_HOME/agent.py\" <<'EOF'\n{AGENT}\nEOF\n",
        "launch": 'python3 "$REROLL_AGENT_HOME/agent.py"',
        "env": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}", "REROLL_MODEL": "{model}"},
    }
}
"""`AGENT` declared as the agent ``urllib-chat`` (an agents file's content)."""


@pytest.fixture
def urllib_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A Chat Completions agent in a dozen lines of urllib (installs in no time)."""
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(URLLIB_AGENTS))
    monkeypatch.setenv(AGENTS_FILE_ENV, str(tmp_path / "agents.yaml"))
    registry.cache_clear()
    yield "urllib-chat"
    registry.cache_clear()


@pytest.mark.parametrize(
    ("spec", "slug"),
    [
        (None, "no-model"),
        ("scripted", "scripted"),
        ("gpt-4o", "gpt-4o"),
        ("scripted:/x/fast.yaml", "scripted-fast-"),
        ("scripted-anthropic:/x/fast.yaml", "scripted-anthropic-fast-"),
        ("openai/gpt-4o", "openai-gpt-4o-"),
    ],
)
def test_model_slug_is_readable(spec: str | None, slug: str) -> None:
    assert model_slug(spec).startswith(slug)
    assert model_slug(spec) == slug or len(model_slug(spec)) == len(slug) + 6


def test_model_slug_keeps_same_named_scripts_apart() -> None:
    assert model_slug("scripted:/a/fast.yaml") != model_slug("scripted:/b/fast.yaml")


def branchable_run(tmp_path: Path, examples: Path, agent: str) -> tuple[Path, str]:
    """A one-exchange run folder of `agent` on the example task, and a scripted model spec
    that solves the task at once (the bundled script without its delays)."""
    script = yaml.safe_load((examples / "fix-failing-test" / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn.pop("delay_seconds", None)
    fast = tmp_path / "fast.yaml"
    fast.write_text(yaml.safe_dump(script))
    run = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"status": "ok"})
    config = {"task_path": str(examples / "fix-failing-test"), "agent": agent, "model": "scripted"}
    (run / "config.json").write_text(json.dumps(config))
    return run, f"scripted:{fast.resolve()}"


@pytest.mark.slow
async def test_branches_are_retried_on_the_job_runner(
    tmp_path: Path, examples: Path, urllib_agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two branches from step 0 in a sandbox whose first start fails: that branch is retried
    (its first attempt set aside in the parent's ``_attempts/``), both finish with reward 1."""
    run, model = branchable_run(tmp_path, examples, urllib_agent)
    monkeypatch.setitem(base.BACKENDS, "flaky", "tests.jobs.flaky_sandbox:FlakySandbox")
    monkeypatch.setitem(flaky_sandbox.FAILURES_LEFT, "starts", 1)
    summary = await branch(
        run,
        at=0,
        models=[model],
        n=2,
        options=RolloutOptions(sandbox="flaky", timeout_seconds=120),
        runner=RunnerOptions(concurrency=1, retry_backoff_seconds=0),
        output=tmp_path / "branched",
    )
    parent = Path(summary.parent)
    slug = model_slug(model)
    assert [(c.folder, c.status, c.reward) for c in summary.children] == [
        (f"{slug}__0", "ok", 1.0),
        (f"{slug}__1", "ok", 1.0),
    ]
    assert [m.mean_reward for m in summary.models] == [1.0]
    assert [p.name for p in (parent / "_attempts").iterdir()] == [f"{slug}__0.attempt1"]
    child = json.loads((parent / f"{slug}__0" / "config.json").read_text())
    assert child["branched_from"]["path"] == str(parent) and child["branched_from"]["branch_index"] == 0
    assert child["sandbox"] == "flaky" and child["timeout_sec"] == 120
    assert (parent / f"{slug}__0" / "harness" / "controller.log").is_file()


@pytest.mark.slow
async def test_branches_run_on_the_ray_executor(tmp_path: Path, examples: Path, urllib_agent: str) -> None:
    """``branch --executor ray``: each branch is a Ray task (the same runner as a job's)."""
    pytest.importorskip("ray", reason="ray is not installed: pip install 'reroll[ray]' (in the dev extra)")
    run, model = branchable_run(tmp_path, examples, urllib_agent)
    summary = await branch(
        run,
        at=0,
        models=[model],
        n=2,
        options=RolloutOptions(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2, executor="ray"),
        output=tmp_path / "branched",
    )
    assert [(c.status, c.reward, c.branch_index) for c in summary.children] == [
        ("ok", 1.0, 0),
        ("ok", 1.0, 1),
    ]
