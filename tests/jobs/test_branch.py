"""``branch`` runs its branches on the job runner: retries of infrastructure failures, folders
named by `model_slug`, the summary tree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.agents import AGENTS_FILE_ENV, registry
from reroll.export import export_lines
from reroll.jobs.branch import branch
from reroll.jobs.branch_points import branch_points
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import model_slug
from reroll.rollout.commands.record import run_task
from reroll.runfolder.asks import ASKS_FILE, AskLog, AskRecord
from reroll.runfolder.run import write_json
from reroll.sandbox import base
from reroll.settings import RolloutSettings
from reroll.view import build_site
from reroll_contracts.errors import ConfigError, ModelError, RunFolderError

from tests.jobs import flaky_sandbox
from tests.rollout.verify.test_judge_model import KEYS, UNKEYED_JUDGE, unkeyed_judge_run
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
        options=RolloutSettings(sandbox="flaky", timeout_seconds=120),
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
        options=RolloutSettings(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2, executor="ray"),
        output=tmp_path / "branched",
    )
    assert [(c.status, c.reward, c.branch_index) for c in summary.children] == [
        ("ok", 1.0, 0),
        ("ok", 1.0, 1),
    ]


@pytest.mark.parametrize(
    ("at", "every", "prompts", "points"),
    [
        ("1", None, (), [("1", None, "")]),
        ("0, 1,2", None, (), [("0", None, "at0"), ("1", None, "at1"), ("2", None, "at2")]),
        ([0, 0.5], None, (), [("0", None, "at0"), ("0.5", None, "at0.5")]),
        (None, 1, (), [("0", None, "at0"), ("1", None, "at1"), ("2", None, "at2")]),
        (None, 2, (), [("0", None, "at0"), ("2", None, "at2")]),
        ("0:0", None, ("a", "b"), [("0:0", "a", "prompt0"), ("0:0", "b", "prompt1")]),
    ],
)
def test_branch_points(
    tmp_path: Path,
    at: str | None,
    every: int | None,
    prompts: tuple[str, ...],
    points: list[tuple[str, str | None, str]],
) -> None:
    """``--at`` with commas and ``--every`` give one point per cut (a value curve), ``--prompt``
    one per prompt; a single point keeps the plain folder names."""
    run = make_run_folder(tmp_path / "run", [exchange_line(0), exchange_line(1)], result={"status": "ok"})
    found = branch_points(run, at, every=every, prompts=prompts)
    assert [(point.at, point.prompt, point.label) for point in found] == points


@pytest.mark.parametrize(
    ("at", "every", "prompts", "message"),
    [
        (None, None, (), "branch needs a checkpoint"),
        ("1", 2, (), "branch needs a checkpoint"),
        (None, 0, (), "--every 0: the step between cut points must be at least 1"),
        ("1,1", None, (), "expected distinct checkpoints"),
        ("1,", None, (), "expected distinct checkpoints"),
        ("0:0,1", None, ("a",), "--prompt needs one checkpoint"),
    ],
)
def test_bad_branch_points(
    tmp_path: Path, at: str | None, every: int | None, prompts: tuple[str, ...], message: str
) -> None:
    run = make_run_folder(tmp_path / "run", [exchange_line(0), exchange_line(1)], result={"status": "ok"})
    with pytest.raises(ConfigError, match=re.escape(message)):
        branch_points(run, at, every=every, prompts=prompts)


SUBMIT_AT_ONCE = {
    "count": "own",
    "turns": [
        {
            "content": "Submitting as it is.",
            "tool_calls": [
                {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
            ],
        }
    ],
}
"""A live model that submits at once, whatever came before (its own turns counted)."""


@pytest.mark.slow
async def test_value_curve_along_a_run(tmp_path: Path, examples: Path, urllib_agent: str) -> None:
    """``branch --at 0,2,4`` of a recorded five-exchange run that fixes the bug at exchange 3,
    with a model that submits at once: the children at 0 and 2 submit the bug (reward 0), the
    children at 4 replay the fix first (reward 1). The summary holds the value per cut point,
    the export each child's point and the curve, the view the curve."""
    _, fast = branchable_run(tmp_path, examples, urllib_agent)
    recorded = await run_task(
        examples / "fix-failing-test",
        agent_name=urllib_agent,
        model=fast,
        options=RolloutSettings(timeout_seconds=120),
        jobs_dir=tmp_path / "jobs",
    )
    assert recorded.result.rewards == {"reward": 1.0} and recorded.result.counts.exchanges == 5
    submit = tmp_path / "submit.yaml"
    submit.write_text(yaml.safe_dump(SUBMIT_AT_ONCE))
    summary = await branch(
        recorded.run_dir,
        at="0,2,4",
        models=[f"scripted:{submit}"],
        n=2,
        options=RolloutSettings(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2),
        output=tmp_path / "branched",
    )
    assert [(p.at, p.cut_index, p.scored, p.mean_reward) for p in summary.points] == [
        ("0", 0, 2, 0.0),
        ("2", 2, 2, 0.0),
        ("4", 4, 2, 1.0),
    ]
    assert summary.cut_index == 4 and summary.at == "0,2,4"
    slug = model_slug(f"scripted:{submit}")
    assert [c.folder for c in summary.children][::2] == [
        f"at0__{slug}__0",
        f"at2__{slug}__0",
        f"at4__{slug}__0",
    ]
    parent = Path(summary.parent)
    child = json.loads((parent / f"at2__{slug}__1" / "config.json").read_text())["branched_from"]
    assert (child["cut_index"], child["at"], child["branch_index"]) == (2, "2", 1)
    records = [json.loads(line) for line in b"".join(export_lines(parent, "verifiers")).splitlines()]
    checkpoints = [record["info"]["checkpoint"] for record in records]
    assert [(c["cut_index"], c["value_estimate"]) for c in checkpoints][::2] == [(0, 0.0), (2, 0.0), (4, 1.0)]
    assert checkpoints[0]["value_curve"] == [
        {"at": "0", "cut_index": 0, "mean_reward": 0.0},
        {"at": "2", "cut_index": 2, "mean_reward": 0.0},
        {"at": "4", "cut_index": 4, "mean_reward": 1.0},
    ]
    page = build_site(parent, tmp_path / "site").read_text()
    assert 'id="value-curve"' in page and page.count('class="num point-value"') == 3


@pytest.mark.slow
async def test_branches_vary_the_next_prompt(tmp_path: Path, examples: Path, urllib_agent: str) -> None:
    """``branch --at 0:0 --prompt A --prompt B``: one group of branches per prompt, each told its
    prompt instead of the recorded instruction (trial.json says ``branch``); a model that fixes
    the bug unless told to just submit gives the two prompts different values."""
    run, fast = branchable_run(tmp_path, examples, urllib_agent)
    script = yaml.safe_load(Path(fast.partition(":")[2]).read_text())
    lazy = {"name": "lazy", "match": {"first_user": "(?i)just submit"}} | SUBMIT_AT_ONCE
    script["threads"] = [lazy]
    (tmp_path / "moody.yaml").write_text(yaml.safe_dump(script))
    prompts = ["Fix the failing test in calc.py.", "Just submit, do nothing."]
    summary = await branch(
        run,
        at="0:0",
        prompts=prompts,
        models=[f"scripted:{tmp_path / 'moody.yaml'}"],
        options=RolloutSettings(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2),
        output=tmp_path / "branched",
    )
    assert [(p.prompt, p.cut_index, p.mean_reward) for p in summary.points] == [
        (prompts[0], 0, 1.0),
        (prompts[1], 0, 0.0),
    ]
    parent = Path(summary.parent)
    for child, prompt in zip(summary.children, prompts, strict=True):
        assert child.folder.startswith(f"prompt{child.point}__")
        turn = json.loads((parent / child.folder / "trial.json").read_text())["turns"][0]
        assert (turn["prompt"], turn["prompt_source"]) == (prompt, "branch")
        assert (
            json.loads((parent / child.folder / "config.json").read_text())["branched_from"]["prompt"]
            == prompt
        )


def asked_run(tmp_path: Path, options: list[str]) -> Path:
    """A three-exchange run folder whose agent asked two questions (at steps 1 and 2)."""
    run = make_run_folder(tmp_path / "run", [exchange_line(i) for i in range(3)], result={"status": "ok"})
    asks = [
        AskRecord(
            question="Which?", options=options, index=0, step=1, asked_at="t", answer="x", answered_by="user"
        ),
        AskRecord(question="Sure?", index=1, step=2, asked_at="t", answer="yes", answered_by="user"),
    ]
    write_json(run / ASKS_FILE, AskLog(asks=asks))
    return run


def test_at_ask_gives_one_point_per_option_or_answer(tmp_path: Path) -> None:
    run = asked_run(tmp_path, ["en", "fr", "de"])
    found = branch_points(run, at_ask=0)
    assert [(p.at, p.answer, p.label) for p in found] == [
        ("1", "en", "option0"),
        ("1", "fr", "option1"),
        ("1", "de", "option2"),
    ]
    found = branch_points(run, at_ask=1, answers=["no", "maybe"])
    assert [(p.at, p.answer, p.label) for p in found] == [("2", "no", "answer0"), ("2", "maybe", "answer1")]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"at_ask": 2}, RunFolderError, "--at-ask 2: the run asked 2 question(s), so N must be within 0..1"),
        (
            {"at_ask": 1},
            ConfigError,
            "--at-ask 1: question 'Sure?' offered no options: give answers (--answer TEXT)",
        ),
        ({"at_ask": 0, "at": "1"}, ConfigError, "branch needs a checkpoint"),
        ({"at": "1", "answers": ["x"]}, ConfigError, "--answer needs --at-ask N"),
        ({"at_ask": 0, "prompts": ["x"]}, ConfigError, "--prompt and --at-ask cannot be combined"),
    ],
)
def test_bad_at_ask(tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        branch_points(asked_run(tmp_path, ["en"]), **kwargs)


def test_at_ask_on_a_run_without_a_question(tmp_path: Path) -> None:
    run = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"status": "ok"})
    with pytest.raises(
        RunFolderError, match=r"--at-ask 0: the run asked no ask_user question \(no asks\.json\)"
    ):
        branch_points(run, at_ask=0)


async def test_an_unusable_judge_model_refuses_the_branch_before_anything_is_written(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first branch's checks run before the parent folder is written (`check_rollout`): a
    judge ``model: claude-sonnet-4-6`` without ANTHROPIC_API_KEY is a `ModelError` naming the
    variable and --judge-model, not a tree whose every branch ends in error (exit 1)."""
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)
    run = unkeyed_judge_run(tmp_path, examples, "ok", 2)
    with pytest.raises(ModelError, match=UNKEYED_JUDGE):
        await branch(run, at="1", models=["scripted"])
    assert sorted(path.name for path in (tmp_path / "job").iterdir()) == ["run"]


@pytest.mark.spawns
def test_a_local_fork_loads_neither_the_docker_sdk_nor_a_model_server() -> None:
    """What ``reroll branch`` loads to fork on the local sandbox with a provider's model (the
    branch, the rollout, the local sandbox, the model specs) holds no docker SDK, no aiohttp.web
    and nothing of the scripted model server."""
    modules = "reroll.cli.branch, reroll.jobs.branch, reroll.rollout.lifecycle, reroll.sandbox.local.isolated"
    code = f"import json, sys, {modules}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    assert "reroll.sandbox.local.isolated" in loaded
    assert sorted(loaded & {"docker", "requests", "aiohttp.web", "reroll_proxy.scripted"}) == []
