"""Resolving ``--at`` to a cut index; opening a checkpoint of a run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.rollout.checkpoint import At, open_checkpoint, resolve_cut
from reroll_contracts.errors import AgentError, RunFolderError, TaskError

from tests.runfolder.test_run import exchange_line, make_run_folder

RUN = Path("/runs/r1")


@pytest.mark.parametrize(
    ("at", "expected"),
    [(None, 5), (0, 0), (5, 5), ("3", 3), (" 2 ", 2), (0.5, 2), ("0.5", 2), (0.0, 0), ("1.0", 5), (0.99, 4)],
)
def test_steps_and_fractions(at: At | None, expected: int) -> None:
    assert resolve_cut(at, 5, RUN) == expected


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (6, "--at 6 is out of range: the run has 5 recorded exchanges, so a step must be within 0..5"),
        (-1, "--at -1 is out of range"),
        ("7", "--at 7 is out of range"),
        (1.5, "--at 1.5: a fraction must be within 0.0..1.0"),
        ("-0.1", "a fraction must be within 0.0..1.0"),
        ("nan", "expected a step index (0..5) or a fraction"),
        ("half", "--at 'half': expected a step index (0..5) or a fraction"),
        (True, "expected a step index or a fraction"),
    ],
)
def test_bad_checkpoints_name_the_run_and_the_range(at: At, message: str) -> None:
    with pytest.raises(RunFolderError, match=r"^/runs/r1: ") as caught:
        resolve_cut(at, 5, RUN)
    assert message in str(caught.value)


def test_an_empty_recording_only_has_step_zero() -> None:
    assert resolve_cut(0.5, 0, RUN) == 0
    with pytest.raises(RunFolderError, match=r"within 0\.\.0"):
        resolve_cut(1, 0, RUN)


def test_open_checkpoint_resolves_the_cut_and_the_provenance(tmp_path: Path, examples: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0), exchange_line(1)], result={"status": "ok"})
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    (folder / "config.json").write_text(json.dumps(config))
    checkpoint = open_checkpoint(folder, at="0.5")
    assert (checkpoint.cut_index, checkpoint.at, checkpoint.status) == (1, "0.5", "ok")
    assert checkpoint.task.name == "fix-failing-test" and checkpoint.agent_model == "scripted"
    provenance = checkpoint.continued_from("openai/gpt-x")
    assert provenance.path == str(folder.resolve()) and provenance.cut_index == 1 and provenance.at == "0.5"
    assert (provenance.original_model, provenance.live_model, provenance.replay_only) == (
        "scripted",
        "openai/gpt-x",
        False,
    )
    with pytest.raises(RunFolderError, match=r"status is 'ok', not 'timeout' \(--require-timeout\)"):
        open_checkpoint(folder, require_timeout=True)


def test_open_checkpoint_of_a_moved_task_asks_for_tasks_dir(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    with pytest.raises(TaskError, match=r"task /tasks/t no longer exists; pass --tasks-dir"):
        open_checkpoint(folder)


def benchflow_openhands_folder(path: Path, task_path: Path, lines: list[str]) -> Path:
    """A run folder as BenchFlow writes it for OpenHands (its only continuable agent): config.json
    with ``agent: openhands`` and a litellm-style Gemini model, a timed-out result.json."""
    folder = make_run_folder(path, lines, result={"rewards": None, "error_category": "timeout"})
    config = {
        "task_path": str(task_path),
        "agent": "openhands",
        "model": "gemini/gemini-3.1-flash-lite-preview",
        "timeout_sec": 900,
        "agent_env": {},
        "started_at": "2026-05-01T10:00:00+00:00",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_benchflow_openhands_folder_opens_with_openhands_or_the_agent_given(
    tmp_path: Path, examples: Path
) -> None:
    folder = benchflow_openhands_folder(tmp_path / "run", examples / "hello-file", [exchange_line(0)])
    checkpoint = open_checkpoint(folder)
    assert (checkpoint.agent.name, checkpoint.status, checkpoint.cut_index) == ("openhands", "timeout", 1)
    assert checkpoint.agent_model == "gemini-3.1-flash-lite-preview"
    assert open_checkpoint(folder, agent="mini-swe-agent").agent.name == "mini-swe-agent"
    with pytest.raises(AgentError, match=r"unknown agent 'nope'.*REROLL_AGENTS_FILE"):
        open_checkpoint(folder, agent="nope")


def two_round_run(tmp_path: Path, examples: Path) -> Path:
    """A User-driven run: round 0 made exchanges 0 and 1, round 1 exchange 2; it asked one
    question at step 1 (answered in exchange 1's request)."""
    lines = []
    for step, turn in enumerate([0, 0, 1]):
        line = json.loads(exchange_line(step))
        line["metadata"] = {"step": step, "place": {"turn": turn, "scene": "s", "role": "r", "round": turn}}
        lines.append(json.dumps(line))
    folder = make_run_folder(tmp_path / "run", lines, result={"status": "ok"})
    config = {"task_path": str(examples / "fix-failing-test"), "agent": "mini-swe-agent", "model": "scripted"}
    (folder / "config.json").write_text(json.dumps(config))
    turns = [
        {"place": {"turn": turn, "scene": "s", "role": "r", "round": turn}, "prompt": f"round {turn}",
         "prompt_source": "user", "status": "ok"}
        for turn in (0, 1)
    ]  # fmt: skip
    (folder / "trial.json").write_text(json.dumps({"turns": turns}))
    ask = {"question": "q?", "index": 0, "step": 1, "asked_at": "t", "answer": "a", "answered_by": "user"}
    (folder / "asks.json").write_text(json.dumps({"asks": [ask]}))
    return folder


@pytest.mark.parametrize("at", ["1:0", "2"])
def test_a_prompt_replaces_the_users_prompt_of_the_round_the_cut_starts(
    tmp_path: Path, examples: Path, at: str
) -> None:
    checkpoint = open_checkpoint(two_round_run(tmp_path, examples), at=at).with_prompt("be brief")
    assert [(t.prompt, t.prompt_source) for t in checkpoint.recorded_turns] == [
        ("round 0", "user"),
        ("be brief", "branch"),
    ]
    assert [ask.answer for ask in checkpoint.recorded_asks] == ["a"]  # asked before the cut


@pytest.mark.parametrize(("at", "cut"), [("1:1", 3), ("0:1", 1), ("1", 1)])
def test_a_prompt_needs_a_cut_at_the_start_of_a_round(
    tmp_path: Path, examples: Path, at: str, cut: int
) -> None:
    checkpoint = open_checkpoint(two_round_run(tmp_path, examples), at=at)
    assert checkpoint.cut_index == cut
    with pytest.raises(
        RunFolderError,
        match=rf"--prompt needs a cut at the start .*exchange {cut}, and the turns start at \[0, 2\]",
    ):
        checkpoint.with_prompt("be brief")
    assert len(checkpoint.recorded_asks) == (0 if cut == 1 else 1)  # the question at step 1 is the cut's
