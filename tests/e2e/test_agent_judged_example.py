"""The agent-judged example (examples/tasks/changelog-entry) end to end in the `local` sandbox: the
oracle writes the entry (and plants links and a FIFO beside it), the agent-judge verifier runs
mini-swe-agent (from PyPI) on the task's scripted judge model in a fresh sandbox over a read-only
copy of the workspace (links copied as links, the FIFO never opened), its verdict file is the
reward; the judge's exchanges are recorded in a run folder of its own and in
trajectory/judge_trajectory.jsonl, ``reroll rescore`` replays them to the same reward byte for
byte, ``rescore --judge-model`` judges live again, and a verdict that is a symlink, a FIFO,
missing or not JSON is a ``verifier_error`` (never followed, never opened)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.e2e.test_judged_example import lines, read_json

pytestmark = pytest.mark.spawns
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = EXAMPLES / "changelog-entry"
REWARDS = {"reward": 0.6667, "mentions-flag": 1.0, "short": 0.0}
"""What the task's scripted judge gives the oracle's entry (see scripted-judge-agent.yaml)."""
PLANTED = "ln -s /etc/shadow shadow\nmkfifo pipe\nln -s /verdict/reward.json verdict-link\n"
"""What the judged agent (the oracle) leaves beside its entry: links to a root-only file and to
the judge's verdict, a FIFO; the copy for the judge must neither follow nor open them."""


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=900)
    print(done.stdout, done.stderr, sep="\n")
    return done


def judge_script(folder: Path, name: str, command: str) -> str:
    """A judge script for mini-swe-agent that runs `command`, then submits; its model spec."""
    script = {
        "turns": [
            {"content": "Judging.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {
                "content": "Done.",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
                ],
            },
        ]
    }
    (folder / name).write_text(yaml.safe_dump(script))
    return f"scripted:{folder / name}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("agent-judged")
    shutil.copytree(TASK, folder / "changelog-entry")
    with open(folder / "changelog-entry" / "oracle" / "solve.sh", "a") as oracle:
        oracle.write(PLANTED)
    return folder


def run_oracle(workdir: Path, job: str, *extra: str) -> Path:
    done = reroll(
        "run", str(workdir / "changelog-entry"), "--agent", "oracle", "--jobs-dir", "jobs", "--job-name", job,
        *extra, cwd=workdir,
    )  # fmt: skip
    (folder,) = (workdir / "jobs" / job).iterdir()
    assert done.returncode in (0, 1), done.stderr
    return folder


@pytest.fixture(scope="module")
def judged_run(workdir: Path) -> Path:
    return run_oracle(workdir, "record")


@pytest.fixture(scope="module")
def rescored(workdir: Path, judged_run: Path) -> Path:
    done = reroll("rescore", str(judged_run), "--output", "rescored", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "rescored").iterdir()
    return folder


def test_the_agent_judges_verdict_is_the_reward(judged_run: Path) -> None:
    result = read_json(judged_run / "result.json")
    assert result["status"] == "ok", result
    assert result["rewards"] == REWARDS
    graded = result["verify_result"]
    assert [(event["source"], event["reward"]) for event in graded["events"]] == [
        ("criterion:mentions-flag", 1.0),
        ("criterion:short", 0.0),
    ]
    assert read_json(judged_run / "verifier" / "reward.json") == graded
    judge = judged_run / "verifier" / "judge"  # the judge's own run folder
    assert read_json(judge / "config.json")["agent"] == "mini-swe-agent"
    assert read_json(judge / "result.json")["verify_result"] == graded
    record = read_json(judged_run / "verifier" / "agent_judge.json")
    assert (record["agent"], record["status"], record["replayed_from"]) == ("mini-swe-agent", "ok", None)


def test_the_judge_is_recorded_in_a_trajectory_of_its_own(judged_run: Path) -> None:
    judge = judged_run / "trajectory" / "judge_trajectory.jsonl"
    assert judge.read_bytes() == (judged_run / "verifier/judge/trajectory/llm_trajectory.jsonl").read_bytes()
    assert [line["metadata"]["source"] for line in lines(judge)] == ["live"] * 3
    assert (judged_run / "trajectory" / "llm_trajectory.jsonl").read_text() == ""  # the oracle calls none
    assert read_json(judged_run / "result.json")["judge_counts"]["exchanges"] == 3


def test_the_judge_sees_the_workspace_read_only_and_no_tests_or_solution(judged_run: Path) -> None:
    exchanges = lines(judged_run / "trajectory" / "judge_trajectory.jsonl")
    prompt = exchanges[0]["request"]["body"]["messages"][-1]["content"]
    assert "- mentions-flag (binary, weight 2)" in prompt and "/verdict/reward.json" in prompt
    seen = json.loads(exchanges[1]["request"]["body"]["messages"][-1]["content"])["output"]  # 1st command's
    assert "`reroll rescore --judge-model M` judges a recorded run again" in seen  # the workspace
    assert "cannot touch 'judge-was-here': Permission denied" in seen
    assert "cannot remove 'CHANGES.md': Permission denied" in seen
    for folder in ("/tests", "/oracle", "/solution"):
        assert f"cannot access '{folder}': No such file or directory" in seen
    manifest = read_json(judged_run / "verifier" / "judge" / "workspace_manifest.json")
    assert manifest == read_json(judged_run / "workspace_manifest.json")  # copied whole, unchanged
    assert (manifest["shadow"], manifest["pipe"]) == ("symlink:/etc/shadow", "fifo:")  # never opened


def test_rescore_replays_the_judge_to_the_same_reward_byte_for_byte(judged_run: Path, rescored: Path) -> None:
    assert (rescored / "verifier/reward.json").read_bytes() == (
        judged_run / "verifier/reward.json"
    ).read_bytes()
    original, again = read_json(judged_run / "result.json"), read_json(rescored / "result.json")
    assert again["status"] == "ok", again
    assert (again["rewards"], again["verify_result"]) == (original["rewards"], original["verify_result"])
    judge = lines(rescored / "trajectory" / "judge_trajectory.jsonl")
    assert [line["metadata"]["source"] for line in judge] == ["replayed"] * 3
    assert again["judge_counts"]["divergences"] == 0
    record = read_json(rescored / "verifier" / "agent_judge.json")
    assert record["replayed_from"] == str(judged_run / "verifier" / "judge")
    assert read_json(rescored / "verifier/judge/config.json")["continued_from"]["replay_only"] is True


def test_rescore_with_another_judge_model_judges_live(workdir: Path, judged_run: Path) -> None:
    other = judge_script(
        workdir, "flat-judge.yaml", """echo '{"reward": 0.25, "tone": 1}' > /verdict/reward.json"""
    )
    done = reroll("rescore", str(judged_run), "--judge-model", other, "--output", "other", cwd=workdir)
    assert done.returncode == 0, done.stderr
    (folder,) = (workdir / "other").iterdir()
    result = read_json(folder / "result.json")
    assert result["rewards"] == {"reward": 0.25, "tone": 1.0}  # the flat form is a verdict too
    assert [line["metadata"]["source"] for line in lines(folder / "trajectory/judge_trajectory.jsonl")] == [
        "live",
        "live",
    ]


NOT_READ = "the judge's verdict /verdict/reward.json is a {}, not a regular file: not read"


@pytest.mark.parametrize(
    ("name", "command", "message"),
    [
        (  # a link to a valid verdict: following it would pay 1.0
            "symlink",
            """echo '{"reward": 1.0}' > /tmp/r.json && ln -s /tmp/r.json /verdict/reward.json""",
            NOT_READ.format("symlink"),
        ),
        ("fifo", "mkfifo /verdict/reward.json", NOT_READ.format("fifo")),  # opening it would block
        ("missing", "echo no verdict", "the judge wrote no verdict: /verdict/reward.json is missing"),
        ("not-json", "echo pass > /verdict/reward.json", "/verdict/reward.json is not valid JSON"),
    ],
)
def test_a_verdict_that_is_no_reward_file_is_a_verifier_error(
    workdir: Path, name: str, command: str, message: str
) -> None:
    hostile = judge_script(workdir, f"{name}-judge.yaml", command)
    run = run_oracle(workdir, f"hostile-{name}", "--judge-model", hostile)
    result = read_json(run / "result.json")
    assert (result["status"], result["error_category"], result["rewards"]) == (
        "error",
        "verifier_error",
        None,
    )
    assert message in result["error"]
    assert f"(its run folder: jobs/hostile-{name}/{run.name}/verifier/judge)" in result["error"]
