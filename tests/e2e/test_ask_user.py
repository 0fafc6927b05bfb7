"""ask_user end to end with the real CLI, Claude Code (from the claude-agent-sdk wheel, its MCP
client unmodified) and the scripted model, in the local sandbox: the example task greet-the-user
does not say the user's language; its trial's User reads French.

- ``reroll run --trial examples/trials/ask-the-user.yaml --ask-user``: Claude Code calls
  ``mcp__reroll__ask_user`` (reroll's MCP server in the sandbox), the trial's User answers
  "French", asks.json records question, options, answer, step and place; reward 1;
- ``reroll continue --at 2``: the question before the cut gets the recorded answer again (its
  exchange replays without divergence);
- ``reroll branch --at-ask 0``: one verified child per option, each told its option: the value of
  each answer (only French scores);
- bad input: ``--at-ask`` beyond the questions, ``--ask-user`` for an agent without MCP.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.export import export_lines
from reroll.view import build_site

from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPT = EXAMPLES / "tasks" / "greet-the-user" / "scripted-model.claude-code.yaml"
MODEL = f"scripted-anthropic:{SCRIPT}"
TRUSTED = str(EXAMPLES / "trials" / "ask_the_user.py")
"""The trial's User: a continuation of its run imports it only when named again (``--trust``)."""
pytestmark = [pytest.mark.slow, pytest.mark.spawns]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ask-user")


@pytest.fixture(scope="module")
def recorded(workdir: Path) -> Path:
    done = reroll(
        "run", "--trial", str(EXAMPLES / "trials" / "ask-the-user.yaml"), "--agent", "claude-code",
        "--ask-user", "--model", MODEL, "--jobs-dir", "jobs", "--job-name", "asked", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return only_folder(workdir / "jobs" / "asked")


def test_the_question_and_the_users_answer_are_recorded(recorded: Path) -> None:
    assert read_json(recorded / "result.json")["rewards"] == {"reward": 1.0}
    assert read_json(recorded / "config.json")["ask_user"] is True
    (ask,) = read_json(recorded / "asks.json")["asks"]
    assert ask["question"] == "Which language should the greeting be in?"
    assert ask["options"] == ["English", "French", "German"]
    assert (ask["answer"], ask["answered_by"], ask["index"], ask["step"]) == ("French", "user", 0, 1)
    assert ask["place"] == {"turn": 0, "scene": "greet", "role": "greeter", "round": 0}
    lines = trajectory(recorded)
    assert len(lines) == 3
    # the tool Claude Code called at step 0 is reroll's, the answer is in step 1's request
    (call,) = [block for block in lines[0]["response"]["body"]["content"] if block["type"] == "tool_use"]
    assert call["name"] == "mcp__reroll__ask_user" and call["input"]["options"] == ask["options"]
    tools = {tool["name"] for tool in lines[0]["request"]["body"]["tools"]}
    assert "mcp__reroll__ask_user" in tools
    result = lines[1]["request"]["body"]["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == [{"type": "text", "text": "French"}]


def test_export_and_view_show_the_question(recorded: Path, tmp_path: Path) -> None:
    (record,) = [json.loads(line) for line in b"".join(export_lines(recorded, "verifiers")).splitlines()]
    (ask,) = record["info"]["asks"]
    assert (ask["question"], ask["answer"], ask["step"]) == (
        "Which language should the greeting be in?",
        "French",
        1,
    )
    page = build_site(recorded, tmp_path / "site").read_text()
    assert 'id="ask-table"' in page and '<td class="ask-answer">French</td>' in page


def test_a_continuation_gives_the_recorded_answer_again(recorded: Path, workdir: Path) -> None:
    done = reroll(
        "continue", str(recorded), "--at", "2", "--output", "continued", "--trust", TRUSTED, cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    continued = only_folder(workdir / "continued")
    result = read_json(continued / "result.json")
    assert result["rewards"] == {"reward": 1.0} and result["counts"]["divergences"] == 0
    (ask,) = read_json(continued / "asks.json")["asks"]
    assert (ask["answer"], ask["answered_by"]) == ("French", "recorded")


def test_at_ask_branches_one_verified_child_per_option(recorded: Path, workdir: Path) -> None:
    done = reroll(
        "branch",
        str(recorded),
        "--at-ask",
        "0",
        "--model",
        MODEL,
        "--output",
        "tree",
        "--trust",
        TRUSTED,
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr
    parent = only_folder(workdir / "tree")
    summary = read_json(parent / "summary.json")
    points = [(p["answer"], p["cut_index"], p["mean_reward"]) for p in summary["points"]]
    assert points == [("English", 1, 0.0), ("French", 1, 1.0), ("German", 1, 0.0)]
    assert [(c["point"], c["status"]) for c in summary["children"]] == [(0, "ok"), (1, "ok"), (2, "ok")]
    for child, option in zip(summary["children"], ["English", "French", "German"], strict=True):
        folder = parent / child["folder"]
        assert child["folder"].startswith(f"option{child['point']}__")
        (ask,) = read_json(folder / "asks.json")["asks"]
        assert (ask["answer"], ask["answered_by"]) == (option, "branch")
        assert [line["metadata"]["source"] for line in trajectory(folder)] == ["replayed", "live", "live"]
        assert read_json(folder / "config.json")["branched_from"]["answer"] == option
    page = build_site(parent, workdir / "tree-site").read_text()
    assert "Value per branch point" in page and 'id="value-curve"' not in page  # one cut: no curve
    assert all(f"answer: <q>{option}</q>" in page for option in ("English", "French", "German"))


def test_at_ask_beyond_the_questions_is_refused(recorded: Path, workdir: Path) -> None:
    done = reroll("branch", str(recorded), "--at-ask", "1", "--model", MODEL, cwd=workdir)
    assert done.returncode == 2
    assert "--at-ask 1: the run asked 1 question(s), so N must be within 0..0" in done.stderr


def test_ask_user_needs_an_agent_with_mcp(workdir: Path) -> None:
    done = reroll(
        "run", str(EXAMPLES / "tasks" / "greet-the-user"), "--agent", "mini-swe-agent", "--ask-user",
        "--model", f"scripted:{SCRIPT}", "--jobs-dir", "refused", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        "--ask-user: the ask_user tool is offered over MCP, and mini-swe-agent has no MCP client"
        in done.stderr
    )
    assert not (workdir / "refused").exists()
