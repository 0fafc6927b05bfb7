"""Trials end to end with real parts: mini-swe-agent from PyPI, the sidecar, the LLM proxy and the
scripted model, as real subprocesses of `reroll`, on the bundled trial examples.

Progressive disclosure (multi-round, a Python User) is recorded with a copy of its script whose
round 3 never answers in time, so the run is cut by its timeout in round 3; its continuation
replays rounds 0-2 (the agent's exchanges and the User's recorded prompts; the User is not
called for them: its calls are counted) and goes on live, User included, to reward 1.0; a
branch at a round boundary asks the User again from there. These run in the local sandbox, the
coder + reviewer example (outbox) too; skill-gen → solve (two scenes, the agent stopped between
them) runs once per sandbox backend.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import labelled_containers, spawning
from tests.e2e.test_main_job import read_json, reroll, trajectory

TRIALS = Path(__file__).resolve().parents[2] / "examples" / "trials"
RECORD_TIMEOUT_SECONDS = 40
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # four rounds, a 40 s cut, on a busy machine

COUNTING_USER = '''
"""The example's User, counting its calls (one line per call in calls.txt beside this file)."""
from pathlib import Path

from progressive_user import disclose as example


def disclose(round, instruction, result):
    with open(Path(__file__).with_name("calls.txt"), "a") as calls:
        calls.write(f"{round}\\n")
    return example(round, instruction, result)
'''


def places(lines: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    return [
        (
            line["metadata"]["place"]["turn"],
            line["metadata"]["place"]["scene"],
            line["metadata"]["place"]["role"],
        )
        for line in lines
    ]


def user_calls(folder: Path) -> list[int]:
    calls = folder / "calls.txt"
    return [int(line) for line in calls.read_text().split()] if calls.exists() else []


@pytest.fixture(scope="module")
def trial_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the progressive-disclosure example whose User counts its calls and whose script
    stalls at round 3's first answer."""
    folder = tmp_path_factory.mktemp("trials")
    for name in ("progressive-disclosure.yaml", "progressive_user.py", "progressive-disclosure.script.yaml"):
        shutil.copy(TRIALS / name, folder / name)
    (folder / "counting_user.py").write_text(COUNTING_USER)
    trial = yaml.safe_load((TRIALS / "progressive-disclosure.yaml").read_text())
    trial["task"] = str(TRIALS.parent / "tasks" / "fix-failing-test")
    trial["scenes"][0]["user"] = "counting_user.py:disclose"
    (folder / "progressive-disclosure.yaml").write_text(yaml.safe_dump(trial))
    script = yaml.safe_load((TRIALS / "progressive-disclosure.script.yaml").read_text())
    (again,) = [thread for thread in script["threads"] if thread["name"] == "again"]
    again["turns"][0]["delay_seconds"] = 3600
    (folder / "stall-in-round-3.yaml").write_text(yaml.safe_dump(script))
    return folder


@pytest.fixture(scope="module")
@spawning
def cut_run(trial_dir: Path) -> Path:
    """A progressive-disclosure run cut by its timeout in round 3."""
    done = reroll(
        "run", "--trial", "progressive-disclosure.yaml", "--agent", "mini-swe-agent",
        "--model", f"scripted:{trial_dir / 'stall-in-round-3.yaml'}",
        "--timeout", str(RECORD_TIMEOUT_SECONDS),
        "--jobs-dir", "jobs", "--job-name", "record",
        cwd=trial_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (folder,) = [path for path in (trial_dir / "jobs" / "record").iterdir() if path.is_dir()]
    return folder


def test_a_run_cut_in_round_3_records_each_round_and_the_users_prompts(
    cut_run: Path, trial_dir: Path
) -> None:
    result = read_json(cut_run / "result.json")
    assert result["status"] == "timeout" and result["rewards"] == {"reward": 0.0}
    record = read_json(cut_run / "trial.json")
    rounds = [turn["place"]["round"] for turn in record["turns"]]
    assert rounds == [0, 1, 2, 3]
    assert [turn["status"] for turn in record["turns"]] == ["ok", "ok", "ok", "timeout"]
    assert [turn["rewards"] for turn in record["turns"][:3]] == [{"reward": 0.0}] * 3
    assert {turn["prompt_source"] for turn in record["turns"]} == {"user"}
    prompts = read_json(cut_run / "prompts.json")
    assert prompts == [turn["prompt"] for turn in record["turns"]]
    assert prompts[0].startswith("Terse spec") and prompts[2].startswith("Full spec")
    assert "Ran 2 tests" in prompts[1] or "FAIL" in prompts[1]  # the hint carries the failing tests
    lines = trajectory(cut_run)
    assert [turn for turn, _, _ in places(lines)] == [0, 0, 1, 1, 2, 2]  # round 3 never got an answer
    assert user_calls(trial_dir) == [0, 1, 2, 3]
    assert not labelled_containers(cut_run.name)


def test_continue_replays_rounds_0_to_2_without_the_user_then_reaches_reward_one(
    cut_run: Path, trial_dir: Path
) -> None:
    (trial_dir / "calls.txt").unlink()
    done = reroll(
        "continue", str(cut_run), "--model", f"scripted:{trial_dir / 'progressive-disclosure.script.yaml'}",
        "--timeout", "120", "--trust", str(trial_dir / "counting_user.py"), cwd=trial_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (continued,) = [path for path in (cut_run.parent / "continued").iterdir() if path.is_dir()]
    result = read_json(continued / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert user_calls(trial_dir) == [4]  # rounds 0-3 re-sent as recorded; asked live after round 3 only
    record = read_json(continued / "trial.json")
    assert [turn["prompt_source"] for turn in record["turns"]] == ["recorded"] * 4
    assert [turn["rewards"] for turn in record["turns"]] == [{"reward": 0.0}] * 3 + [{"reward": 1.0}]
    assert record["user_stopped"] == ["solve"]
    original, lines = trajectory(cut_run), trajectory(continued)
    assert [line["metadata"]["source"] for line in lines] == ["replayed"] * 6 + ["live"] * 3
    for replayed, recorded in zip(lines, original, strict=False):  # step for step
        assert replayed["metadata"]["place"] == recorded["metadata"]["place"]
        assert replayed["metadata"]["divergence"] is None
        assert replayed["request"]["body"]["messages"] == recorded["request"]["body"]["messages"]
        assert replayed["response"]["body"] == recorded["response"]["body"]
    assert [turn for turn, _, _ in places(lines)][6:] == [3, 3, 3]
    assert read_json(continued / "prompts.json") == read_json(cut_run / "prompts.json")
    assert read_json(continued / "config.json")["continued_from"]["cut_index"] == 6


def test_branch_at_a_round_boundary_goes_live_from_that_round(cut_run: Path, trial_dir: Path) -> None:
    (trial_dir / "calls.txt").unlink(missing_ok=True)
    script = trial_dir / "progressive-disclosure.script.yaml"
    done = reroll("branch", str(cut_run), "--at", "2:0", "--model", f"scripted:{script}",
                  "--output", "branches", "--timeout", "120", "--trust", "counting_user.py",
                  cwd=trial_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr
    children = [
        p for p in (trial_dir / "branches").rglob("result.json") if (p.parent / "trial.json").exists()
    ]
    assert len(children) == 1
    child = children[0].parent
    assert read_json(child / "result.json")["rewards"] == {"reward": 1.0}
    record = read_json(child / "trial.json")
    # round 2's prompt was decided before the cut: re-sent; round 3 on: the User live
    assert [turn["prompt_source"] for turn in record["turns"]] == ["recorded"] * 3 + ["user"]
    assert user_calls(trial_dir) == [3, 4]
    sources = [line["metadata"]["source"] for line in trajectory(child)]
    assert sources == ["replayed"] * 4 + ["live"] * 5


def test_coder_and_reviewer_talk_through_the_outbox(tmp_path: Path) -> None:
    done = reroll("run", "--trial", str(TRIALS / "coder-reviewer.yaml"), "--agent", "mini-swe-agent",
                  "--jobs-dir", "jobs", "--job-name", "cr", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = [path for path in (tmp_path / "jobs" / "cr").iterdir() if path.is_dir()]
    assert read_json(run / "result.json")["rewards"] == {"reward": 1.0}
    record = read_json(run / "trial.json")
    assert [turn["place"]["role"] for turn in record["turns"]] == ["coder", "reviewer", "coder"]
    last = record["turns"][2]["prompt"]
    assert last.startswith("Address the reviewer's feedback.")
    assert "From reviewer: mean() must divide by len(values)" in last
    assert {role for _, _, role in places(trajectory(run))} == {"coder", "reviewer"}


def test_skill_gen_then_solve_in_two_scenes(tmp_path: Path, sandbox_backend: str) -> None:
    done = reroll("run", "--trial", str(TRIALS / "skill-gen-solve.yaml"), "--agent", "mini-swe-agent",
                  "--jobs-dir", "jobs", "--job-name", "sg", "--sandbox", sandbox_backend,
                  cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = [path for path in (tmp_path / "jobs" / "sg").iterdir() if path.is_dir()]
    assert read_json(run / "result.json")["rewards"] == {"reward": 1.0}
    lines = trajectory(run)
    assert [(scene, role) for _, scene, role in places(lines)] == [("skill-gen", "gen")] * 2 + [
        ("solve", "solver")
    ] * 3
    # the solver's second request carries the skill the first scene wrote (its `cat` output)
    assert "Fix the code, never the tests" in json.dumps(lines[3]["request"]["body"]["messages"])
    assert "skills/fix-tests.md" in read_json(run / "workspace_manifest.json")
    assert not labelled_containers(run.name)
