"""A persona User (`reroll.rollout.turns.persona`) end to end, with the real CLI, Claude Code (from the
claude-agent-sdk wheel, its MCP client unmodified) and the scripted model playing both the agent
and the persona, in the local sandbox, on greet-the-user (the user reads French; the task does
not say so):

- ``reroll run --trial examples/trials/ask-a-persona.yaml --ask-user``: Claude Code asks, the
  persona's model answers "French" (its script), reward 1; its exchange is in the run folder
  (``trajectory/user_trajectory.jsonl``, the agent's exchange format) and asks.json names it;
- ``reroll continue --at 2`` with a persona model that cannot be reached: the question before
  the cut is answered from the persona's recording (the exchange replayed), so the model is
  never called and the run scores 1 again;
- ``reroll continue --at 0 --user-model`` a script that answers "German": live after the cut;
- ``reroll continue-job --user-model``: a timed-out copy's continuation has that model, the
  recorded answer served again;
- ``reroll replay``: the persona's exchange replayed, nothing live;
- a persona model that cannot be reached, live: the rollout ends ``infrastructure`` with the
  cause (model, question, HTTP status, the upstream's error), and what was recorded is kept.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from reroll.rollout.side_model import SideModel
from reroll.rollout.turns.asks import Answerer
from reroll.rollout.turns.persona import PersonaPlan, PersonaUser, open_persona, persona_model
from reroll.runfolder.asks import AskRecord
from reroll.trials.config import Persona
from reroll.trials.users import RoundResult
from reroll_contracts.asks import PendingAsk
from reroll_contracts.errors import ModelError, RunFolderError

from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
AGENT_MODEL = (
    f"scripted-anthropic:{EXAMPLES / 'tasks' / 'greet-the-user' / 'scripted-model.claude-code.yaml'}"
)
TRIAL = EXAMPLES / "trials" / "ask-a-persona.yaml"


def user_lines(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "trajectory" / "user_trajectory.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def continue_at(recorded: Path, workdir: Path, at: str, user_model: str, *, exit_code: int = 0) -> Path:
    """``reroll continue RECORDED --at AT --user-model USER_MODEL``: the new run folder."""
    output = f"at{at}-{len(list(workdir.iterdir()))}"
    done = reroll(
        "continue", str(recorded), "--at", at, "--user-model", user_model, "--output", output, cwd=workdir
    )  # fmt: skip
    assert done.returncode == exit_code, done.stderr
    return only_folder(workdir / output)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> str:
    """A persona model whose provider listens nowhere (``PERSONA_BASE_URL``, a closed port)."""
    monkeypatch.setenv("PERSONA_BASE_URL", f"http://127.0.0.1:{closed_port()}/v1")
    monkeypatch.setenv("PERSONA_API_KEY", "unused")
    return "persona/camille-1"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("persona")
    (folder / "german.yaml").write_text('turns:\n  - content: "German"\n')
    return folder


@pytest.fixture(scope="module")
def recorded(workdir: Path) -> Path:
    done = reroll(
        "run", "--trial", str(TRIAL), "--agent", "claude-code", "--ask-user", "--model", AGENT_MODEL,
        "--jobs-dir", "jobs", "--job-name", "asked", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return only_folder(workdir / "jobs" / "asked")


@pytest.mark.slow
@pytest.mark.spawns
def test_the_persona_answers_and_its_exchange_is_recorded(recorded: Path) -> None:
    assert read_json(recorded / "result.json")["rewards"] == {"reward": 1.0}
    (ask,) = read_json(recorded / "asks.json")["asks"]
    assert (ask["answer"], ask["answered_by"], ask["user_exchange"], ask["step"]) == ("French", "user", 0, 1)
    (line,) = user_lines(recorded)
    assert line["metadata"]["source"] == "live" and line["response"]["status_code"] == 200
    system, question = line["request"]["body"]["messages"]
    assert "You are Camille, a retired teacher from Lyon." in system["content"]
    assert "Write a one-line greeting" in system["content"]  # the task the persona gave
    assert question["content"] == (
        "The agent asks: Which language should the greeting be in?\nOptions:\n- English\n- French\n- German"
    )
    assert line["response"]["body"]["choices"][0]["message"]["content"] == "French"
    persona = read_json(recorded / "config.json")["trial"]["scenes"][0]["persona"]
    assert persona["text"].startswith("You are Camille") and persona["model"].startswith("scripted:/")
    assert len(trajectory(recorded)) == 3  # the agent's own, apart
    counts = read_json(recorded / "result.json")["user_counts"]
    assert (counts["exchanges"], counts["live"], counts["replayed"]) == (1, 1, 0)


@pytest.mark.slow
@pytest.mark.spawns
def test_a_continuation_serves_the_recorded_answer_without_asking_the_model(
    recorded: Path, workdir: Path, unreachable: str
) -> None:
    continued = continue_at(recorded, workdir, "2", unreachable)
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    (ask,) = read_json(continued / "asks.json")["asks"]
    assert (ask["answer"], ask["answered_by"], ask["user_exchange"]) == ("French", "recorded", 0)
    (line,) = user_lines(continued)
    assert line["metadata"]["source"] == "replayed" and line["metadata"]["divergence"] is None
    assert line["response"]["body"] == user_lines(recorded)[0]["response"]["body"]  # byte for byte
    assert read_json(continued / "config.json")["user_model"] == unreachable
    counts = read_json(continued / "result.json")["user_counts"]
    assert (counts["exchanges"], counts["live"], counts["replayed"], counts["divergences"]) == (1, 0, 1, 0)


@pytest.mark.slow
@pytest.mark.spawns
def test_continue_job_takes_the_user_model(recorded: Path, workdir: Path, unreachable: str) -> None:
    """``reroll continue-job --user-model``: the timed-out run's continuation has that persona
    model; the whole recording is replayed, so the recorded answer is served and it is not asked."""
    job = workdir / "timed-out"
    shutil.copytree(recorded, job / recorded.name, symlinks=True)
    result = read_json(job / recorded.name / "result.json")
    (job / recorded.name / "result.json").write_text(json.dumps({**result, "status": "timeout"}))
    done = reroll("continue-job", str(job), "--user-model", unreachable, cwd=workdir)
    assert done.returncode == 0, done.stderr
    continued = job / "continued" / recorded.name
    assert read_json(continued / "config.json")["user_model"] == unreachable
    assert [line["metadata"]["source"] for line in user_lines(continued)] == ["replayed"]
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}


@pytest.mark.slow
@pytest.mark.spawns
def test_after_the_cut_the_persona_model_answers_live(recorded: Path, workdir: Path) -> None:
    continued = continue_at(recorded, workdir, "0", f"scripted:{workdir / 'german.yaml'}")
    assert read_json(continued / "result.json")["rewards"] == {"reward": 0.0}
    (ask,) = read_json(continued / "asks.json")["asks"]
    assert (ask["answer"], ask["answered_by"], ask["user_exchange"]) == ("German", "user", 0)
    assert [line["metadata"]["source"] for line in user_lines(continued)] == ["live"]


@pytest.mark.slow
@pytest.mark.spawns
def test_a_replay_replays_the_persona_too(recorded: Path, workdir: Path) -> None:
    done = reroll("replay", str(recorded), "--output", "replayed", cwd=workdir)
    assert done.returncode == 0, done.stderr
    replayed = only_folder(workdir / "replayed")
    (ask,) = read_json(replayed / "asks.json")["asks"]
    assert (ask["answer"], ask["answered_by"]) == ("French", "recorded")
    assert [line["metadata"]["source"] for line in user_lines(replayed)] == ["replayed"]


@pytest.mark.slow
@pytest.mark.spawns
def test_an_unreachable_persona_model_ends_the_rollout_naming_the_cause(
    recorded: Path, workdir: Path, unreachable: str
) -> None:
    failed = continue_at(recorded, workdir, "0", unreachable, exit_code=1)
    result = read_json(failed / "result.json")
    assert (result["status"], result["error_category"]) == ("error", "infrastructure")
    assert result["error"].startswith(
        "the persona's model camille-1 on the question 'Which language should the greeting be in?': HTTP 502"
    )
    assert "unreachable" in result["error"]
    # nothing recorded is lost: the agent's question and the persona's failed call are kept
    assert [line["metadata"]["source"] for line in trajectory(failed)] == ["live"]
    (line,) = user_lines(failed)
    assert line["response"]["status_code"] == 502


@pytest.mark.spawns
async def test_a_branch_answer_joins_the_personas_conversation(tmp_path: Path) -> None:
    """In process (the shared proxy and scripted model server are real): a branch's answer to
    question 0 is not the persona's, so no model call, but the model's request for question 1
    holds it; asks.json names the exchange of the one answer the model gave."""
    script = tmp_path / "persona.yaml"
    script.write_text('turns:\n  - content: "(never asked)"\n  - content: "  Yes, please.  "\n')
    persona = Persona(text="You are terse.", model=f"scripted:{script}")
    answerer = Answerer(tmp_path, branch_answer="German")
    async with open_persona(persona, PersonaPlan(), tmp_path) as user:
        user.setup("Greet me.", None)
        first = await answerer.answer(
            PendingAsk(id=0, question="Language?", options=["French", "German"], step=1, asked_at="t"), user
        )
        second = await answerer.answer(PendingAsk(id=1, question="Add an emoji?", step=3, asked_at="t"), user)
    assert (first.answer, first.answered_by, first.user_exchange) == ("German", "branch", None)
    assert (second.answer, second.answered_by, second.user_exchange) == ("Yes, please.", "user", 0)
    (line,) = user_lines(tmp_path)
    assert [message["role"] for message in line["request"]["body"]["messages"]] == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    assert line["request"]["body"]["messages"][2]["content"] == "German"
    assert line["request"]["body"]["messages"][3]["content"] == "The agent asks: Add an emoji?"


async def test_no_persona_model_is_refused() -> None:
    with pytest.raises(
        ModelError, match="the trial's persona has no model: set its `model`, or pass --user-model"
    ):
        persona_model(Persona(text="x"), PersonaPlan())
    assert persona_model(Persona(text="x", model="a/b"), PersonaPlan(user_model="c/d")) == "c/d"


@pytest.mark.spawns
async def test_a_persona_with_prompts_writes_the_next_rounds_and_its_recording_replays(
    tmp_path: Path,
) -> None:
    """In process: with ``prompts``, the model reads each round's result and writes the next
    prompt, DONE ending the scene; a second persona on the recording with a cut of 1 serves the
    first prompt from it (not from its own script) and asks its model live after it."""
    recorded, later = tmp_path / "recorded", tmp_path / "later"
    recorded.mkdir()
    later.mkdir()
    first, other = tmp_path / "first.yaml", tmp_path / "other.yaml"
    first.write_text('turns:\n  - content: "Now in French."\n  - content: "done."\n')
    other.write_text('turns:\n  - content: "(not asked: replayed)"\n  - content: "One more time."\n')
    persona = Persona(text="You are exacting.", model=f"scripted:{first}", prompts=True)
    failed = RoundResult(round=0, prompt="Greet.", rewards={"reward": 0.0}, verifier_output="no Bonjour\n")
    passed = RoundResult(round=1, prompt="Now in French.", rewards={"reward": 1.0}, exit_code=0)
    async with open_persona(persona, PersonaPlan(), recorded) as user:
        user.setup("Greet.", None)
        assert await user.run(0, "Greet.", None) == "Greet."  # the instruction: no model call
        assert await user.run(1, "Greet.", failed) == "Now in French."
        assert await user.run(2, "Greet.", passed) is None  # "done." is DONE
    report = user_lines(recorded)[0]["request"]["body"]["messages"][-1]["content"]
    assert report.startswith(
        "The agent finished round 0 (exit code None). The checks of your task: reward 0."
    )
    assert "no Bonjour" in report and report.endswith(
        "or reply exactly DONE if the task is done as you want it."
    )
    plan = PersonaPlan(
        user_model=f"scripted:{other}", replay=recorded / "trajectory" / "user_trajectory.jsonl", cut_index=1
    )
    async with open_persona(persona, plan, later) as user:
        user.setup("Greet.", None)
        assert await user.run(1, "Greet.", failed) == "Now in French."  # the recorded one
        assert await user.run(2, "Greet.", passed) == "One more time."  # live, its own script
    assert [line["metadata"]["source"] for line in user_lines(later)] == ["replayed", "live"]
    assert (
        PersonaUser(Persona(text="x"), SideModel(tmp_path / "t", tmp_path / "w", spec="s")).persona.prompts
        is False
    )


@pytest.mark.slow
@pytest.mark.spawns
def test_a_persona_writes_later_prompts_and_a_continuation_replays_them(tmp_path: Path) -> None:
    """mini-swe-agent (scripted: the progressive-disclosure example's script) on fix-failing-test,
    its rounds' prompts written by the persona's model (``prompts: true``): the instruction, then
    the full spec (a wrong fix), then "still failing" (the right fix), then DONE. A continuation
    at turn 2's start serves the persona's two recorded prompts and asks its model live (another
    script) only for the decision after turn 2."""
    (tmp_path / "persona.yaml").write_text(
        'turns:\n  - content: "Full spec: mean() returns the arithmetic mean."\n'
        '  - content: "Still failing: mean() is wrong."\n  - content: "DONE"\n'
    )
    (tmp_path / "other.yaml").write_text('turns:\n  - content: "A"\n  - content: "B"\n  - content: "Done."\n')
    agent_script = EXAMPLES / "trials" / "progressive-disclosure.script.yaml"
    (tmp_path / "trial.yaml").write_text(
        f"task: {EXAMPLES / 'tasks' / 'fix-failing-test'}\nscenes:\n  - name: solve\n"
        f"    roles: [{{name: solver, model: 'scripted:{agent_script}'}}]\n"
        "    persona: {text: 'You maintain calc.py.', model: 'scripted:persona.yaml', prompts: true}\n"
        "    max_rounds: 5\n"
    )
    done = reroll(
        "run", "--trial", "trial.yaml", "--agent", "mini-swe-agent", "--jobs-dir", "jobs", "--job-name", "p",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = only_folder(tmp_path / "jobs" / "p")
    assert read_json(recorded / "result.json")["rewards"] == {"reward": 1.0}
    turns = read_json(recorded / "trial.json")["turns"]
    assert [(t["prompt"][:20], t["prompt_source"], t["user_exchange"]) for t in turns] == [
        ("The unit tests in `t", "user", None),
        ("Full spec: mean() re", "user", 0),
        ("Still failing: mean(", "user", 1),
    ]
    assert read_json(recorded / "trial.json")["user_stopped"] == ["solve"]
    assert [line["metadata"]["source"] for line in user_lines(recorded)] == ["live"] * 3
    continued = continue_at(recorded, tmp_path, "2:0", f"scripted:{tmp_path / 'other.yaml'}")
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    again = read_json(continued / "trial.json")
    assert [t["prompt"] for t in again["turns"]] == [t["prompt"] for t in turns]
    assert [t["user_exchange"] for t in again["turns"]] == [None, 0, 1]
    assert again["user_stopped"] == ["solve"]  # "Done." from the live script
    lines = user_lines(continued)
    assert [line["metadata"]["source"] for line in lines] == ["replayed", "replayed", "live"]
    assert lines[2]["response"]["body"]["choices"][0]["message"]["content"] == "Done."


def test_a_fifo_for_the_persona_recording_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A crafted run folder whose user_trajectory.jsonl is a FIFO nobody writes (issue 32): the
    plan of its continuation refuses it, naming the file, instead of blocking on it."""
    run_dir = tmp_path / "run"
    (run_dir / "trajectory").mkdir(parents=True)
    os.mkfifo(run_dir / "trajectory" / "user_trajectory.jsonl")
    ask = AskRecord(
        index=0, step=0, question="?", asked_at="t", answer="yes", answered_by="user", user_exchange=0
    )
    with pytest.raises(RunFolderError, match=r"user_trajectory\.jsonl: refused: not a regular file"):
        PersonaPlan.from_recorded(run_dir, [ask], [], live=True)
