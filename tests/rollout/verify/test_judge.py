"""The llm-judge verifier (`reroll.rollout.verify.judge`): how it reads the judge's answers, what a judge
that cannot score gives (``verifier_error`` with the cause), and that a process in the sandbox
cannot reach the judge's proxy."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest
from reroll import conformance
from reroll.models.spec import live_upstream, parse_model
from reroll.rollout.commands.record import run_task
from reroll.rollout.commands.rescore import rescore_run
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.rollout.side_model import side_proxy
from reroll.rollout.verify.judge import _answer as answer_of
from reroll.runfolder.run import JUDGE_TRAJECTORY
from reroll.sandbox.local import rootview
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.settings import RolloutSettings
from reroll.tasks.rubric import Criterion
from reroll.tasks.task import load_task
from reroll_contracts.errors import ModelError, RunFolderError, VerifierError

BINARY = Criterion(name="accurate", description="The answer is accurate.")
LIKERT = Criterion(name="clear", description="The answer is clear.", type="likert", points=5)
PROBE = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print(target, "connected")
    except OSError as exc:
        print(target, type(exc).__name__)
"""


def test_an_answer_is_the_json_object_in_the_judges_text() -> None:
    fenced = 'Here it is:\n```json\n{"verdict": "PASS", "reasoning": "right"}\n```'
    assert (answer_of(BINARY, fenced).score, answer_of(BINARY, fenced).reasoning) == (1.0, "right")
    assert answer_of(BINARY, '{"verdict": "fail"}').score == 0.0
    assert answer_of(LIKERT, '{"score": 3, "reasoning": "so so"}').score == 0.5
    assert answer_of(LIKERT, '{"score": 9}').score == 1.0  # clamped


@pytest.mark.parametrize(
    ("criterion", "text", "message"),
    [
        (BINARY, "It is accurate.", r"criterion 'accurate' holds no JSON object: 'It is accurate.'"),
        (BINARY, '{"verdict": "maybe"}', r"criterion 'accurate' has no verdict 'pass' or 'fail'"),
        (LIKERT, '{"score": "high"}', r"criterion 'clear' has no numeric score"),
        (LIKERT, '{"score": 3', r"holds no JSON object"),
    ],
)
def test_an_answer_that_does_not_parse_names_the_item_and_quotes_it(
    criterion: Criterion, text: str, message: str
) -> None:
    with pytest.raises(VerifierError, match=message):
        answer_of(criterion, text)


@pytest.mark.spawns  # real rollouts: sidecar, proxy and scripted model processes
async def test_a_judge_that_answers_prose_is_a_verifier_error(tmp_path: Path, examples: Path) -> None:
    prose = tmp_path / "prose.yaml"
    prose.write_text("turns:\n  - content: 'The note looks fine to me.'\n")
    outcome = await run_task(
        examples / "release-note",
        agent_name="oracle",
        options=RolloutSettings(judge_model=f"scripted:{prose}"),
        jobs_dir=tmp_path / "jobs",
        job_name="j",
    )
    result = json.loads((outcome.run_dir / "result.json").read_text())
    assert (result["status"], result["error_category"], result["rewards"]) == (
        "error",
        "verifier_error",
        None,
    )
    assert (
        "criterion 'mentions-rescore' holds no JSON object: 'The note looks fine to me.'" in result["error"]
    )
    assert (outcome.run_dir / "trajectory" / "judge_trajectory.jsonl").is_file()  # recorded all the same


@pytest.mark.spawns
async def test_a_judged_task_without_a_judge_model_is_a_verifier_error(
    tmp_path: Path, examples: Path
) -> None:
    task = tmp_path / "task"
    shutil.copytree(examples / "release-note", task)
    document = task / "verifier" / "verifier.md"
    document.write_text(document.read_text().replace("      model: scripted:scripted-judge.yaml\n", ""))
    outcome = await run_task(task, agent_name="oracle", jobs_dir=tmp_path / "jobs", job_name="j")
    result = json.loads((outcome.run_dir / "result.json").read_text())
    assert (result["status"], result["error_category"]) == ("error", "verifier_error")
    assert (
        "no judge model (set verifier model, the rubric's [judge] model, or --judge-model)" in result["error"]
    )


@pytest.mark.spawns
@pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces")
async def test_the_sandbox_cannot_reach_the_judges_proxy(tmp_path: Path, examples: Path) -> None:
    """Attack: a process of the agent's user probes the judge's proxy port on every address the
    sandbox could know (loopback, its own proxy address); the host reaches it (so it is up)."""
    task = load_task(examples / "release-note")
    script = examples / "release-note" / "scripted-judge.yaml"
    run_dir = tmp_path / "run"
    (run_dir / "trajectory").mkdir(parents=True)
    sandbox = IsolatedSandbox(sandbox_spec(task), "judge-attack")
    async with contextlib.AsyncExitStack() as stack:
        upstream = await stack.enter_async_context(
            live_upstream(parse_model(f"scripted:{script}", None), tmp_path)
        )
        proxy = side_proxy(run_dir / JUDGE_TRAJECTORY, tmp_path, upstream, None)
        await stack.enter_async_context(proxy)
        await stack.enter_async_context(sandbox)
        port = proxy.base_url.rsplit(":", 1)[1].split("/")[0]
        targets = [f"127.0.0.1:{port}", f"{await sandbox.host_address()}:{port}", f"localhost:{port}"]
        env = {"PATH": f"{Path(sys.base_prefix) / 'bin'}:/usr/bin:/bin"}
        probe = PROBE.replace('"', '\\"')
        out = await conformance.sh(
            sandbox, f'python3 -c "{probe}" {" ".join(targets)}', user="agent", env=env
        )
        results = dict(line.split(" ", 1) for line in out.strip().splitlines())
        assert len(results) == 3 and "connected" not in results.values(), out
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Criterion: short\n"}]}
        async with (  # from the host, with its token, it answers
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {proxy.token}"}) as session,
            session.post(proxy.base_url + "/chat/completions", json=body) as response,
        ):
            assert response.status == 200, await response.text()
            assert "About 35 words." in await response.text()


@pytest.mark.spawns
async def test_an_oracle_run_is_rescored_with_another_judge(tmp_path: Path, examples: Path) -> None:
    """An agent that calls no model leaves an empty trajectory: its run is rebuilt (the oracle
    runs again) and judged by another model."""
    outcome = await run_task(examples / "release-note", agent_name="oracle", jobs_dir=tmp_path, job_name="j")
    assert outcome.result.rewards is not None and outcome.result.rewards["reward"] == 0.9375
    assert (outcome.run_dir / "trajectory" / "llm_trajectory.jsonl").read_bytes() == b""
    strict = f"scripted:{examples / 'release-note' / 'scripted-judge-strict.yaml'}"
    again = await rescore_run(outcome.run_dir, judge_model=strict, output=tmp_path / "rescored")
    assert again.result.rewards is not None and again.result.rewards["reward"] == 0.5625
    assert again.result.verify_result is not None and again.result.verify_result.items["short"] == 0.0


async def test_rescore_without_recorded_judge_answers_asks_for_a_judge_model(
    tmp_path: Path, examples: Path
) -> None:
    run = tmp_path / "run"
    (run / "trajectory").mkdir(parents=True)
    (run / "trajectory" / "llm_trajectory.jsonl").write_bytes(b"")
    config = {"task_path": str(examples / "release-note"), "agent": "oracle"}
    (run / "config.json").write_text(json.dumps(config))
    (run / "prompts.json").write_text("[]")
    with pytest.raises(RunFolderError, match=r"judge_trajectory\.jsonl: missing.*pass --judge-model"):
        await rescore_run(run, output=tmp_path / "out")
    assert not (tmp_path / "out").exists()


async def test_a_judge_model_that_cannot_be_used_is_refused_before_anything_is_written(
    tmp_path: Path, examples: Path
) -> None:
    with pytest.raises(ModelError, match=r"missing\.yaml not found"):
        await run_task(
            examples / "release-note",
            agent_name="oracle",
            options=RolloutSettings(judge_model=f"scripted:{tmp_path / 'missing.yaml'}"),
            jobs_dir=tmp_path / "jobs",
            job_name="j",
        )
    assert not (tmp_path / "jobs").exists()
