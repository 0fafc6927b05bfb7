"""`reroll export --format atif`: the same trajectory from every wire format, continuations,
threads, branch trees, and clear errors for corrupt run folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from atif import Trajectory
from reroll.export import export_lines
from reroll.export.atif import run_to_atif
from reroll.runfolder.folders import kind_of
from reroll.runfolder.run import load_run_folder
from reroll_contracts.errors import RunFolderError, TrajectoryFormatError

from tests.export.conftest import (
    GRADED,
    WEIGHTED,
    WEIGHTED_RESULT,
    chat_exchanges,
    in_format,
    write_run,
    write_side,
    write_tree,
)

FORMATS = ["openai-chat", "openai-responses", "anthropic-messages"]


def _export(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(b"".join(export_lines(path, "atif")))
    return data


def _comparable(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The steps without what names the wire format (its name and its own stop-reason words)."""
    steps = []
    for step in trajectory["steps"]:
        extra = {k: v for k, v in step["extra"].items() if k not in ("api_format", "stop_reason")}
        steps.append({**step, "extra": extra})
    return steps


def test_every_wire_format_gives_the_same_steps(tmp_path: Path) -> None:
    exported = {f: _export(write_run(tmp_path / f, in_format(f), api_format=f)) for f in FORMATS}
    chat = exported["openai-chat"]
    for fmt in FORMATS[1:]:
        assert _comparable(exported[fmt]) == _comparable(chat), fmt
        assert exported[fmt]["agent"]["tool_definitions"] == chat["agent"]["tool_definitions"], fmt
    assert [step["source"] for step in chat["steps"]] == ["system", "user", "agent", "agent", "agent"]
    first = chat["steps"][2]
    assert first["tool_calls"] == [
        {"tool_call_id": "call_0", "function_name": "bash", "arguments": {"command": "cat test_math.py"}}
    ]
    assert first["observation"]["results"] == [
        {"source_call_id": "call_0", "content": "def test_add(): assert add(1, 2) == 3"}
    ]
    assert first["metrics"] == {"prompt_tokens": 100, "completion_tokens": 10, "cached_tokens": 0}
    assert chat["final_metrics"]["total_prompt_tokens"] == 303
    assert chat["extra"]["reroll"]["rewards"] == {"reward": 1.0}
    Trajectory.model_validate(chat)  # the round trip through the atif models


def test_a_continued_run_marks_the_replayed_prefix_as_copied_context(tmp_path: Path) -> None:
    original = write_run(tmp_path / "original", chat_exchanges(), result={"status": "timeout"})
    continued_from = {
        "path": str(original),
        "status": "timeout",
        "cut_index": 2,
        "original_model": "gpt-test",
        "live_model": "gpt-test",
    }
    run = write_run(
        tmp_path / "continued", chat_exchanges(), replayed=2, config={"continued_from": continued_from}
    )
    trajectory = run_to_atif(load_run_folder(run))
    copied = [step.is_copied_context for step in trajectory.steps]
    assert copied == [True, True, True, True, None]
    assert trajectory.extra is not None
    assert trajectory.extra["reroll"]["continued_from"]["path"] == str(original)
    assert trajectory.extra["reroll"]["continued_from"]["cut_index"] == 2


def test_a_side_call_becomes_a_subagent_trajectory(tmp_path: Path) -> None:
    pairs = chat_exchanges()
    side = (
        {"model": "gpt-test", "messages": [{"role": "user", "content": "Title for: fix the test"}]},
        pairs[0][1],
    )
    run = write_run(tmp_path / "run", [pairs[0], side, *pairs[1:]])
    trajectory = run_to_atif(load_run_folder(run))
    assert len(trajectory.steps) == 5
    assert trajectory.subagent_trajectories is not None
    (sub,) = trajectory.subagent_trajectories
    assert sub.trajectory_id == "run/thread-1"
    assert sub.steps[0].message == "Title for: fix the test"


def test_a_branch_tree_exports_one_trajectory_per_child(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree", [1.0, 0.0])
    assert kind_of(tree) == "tree"
    lines = b"".join(export_lines(tree, "atif")).splitlines()
    assert len(lines) == 2
    first, second = (Trajectory.model_validate_json(line) for line in lines)
    assert first.extra is not None and second.extra is not None
    assert first.extra["reroll"]["checkpoint"]["value_estimate"] == 0.5
    assert [t.extra["reroll"]["rewards"]["reward"] for t in (first, second) if t.extra] == [1.0, 0.0]
    assert first.steps[2].is_copied_context is True


def test_a_corrupt_trajectory_line_is_named(chat_run: Path) -> None:
    trajectory = chat_run / "trajectory" / "llm_trajectory.jsonl"
    lines = trajectory.read_bytes().splitlines(keepends=True)
    trajectory.write_bytes(lines[0] + b'{"request": 1}\n' + lines[1])
    with pytest.raises(TrajectoryFormatError, match=r"llm_trajectory.jsonl: line 2: not an exchange"):
        list(export_lines(chat_run, "atif"))


def test_a_truncated_last_line_is_ignored_and_noted(chat_run: Path) -> None:
    trajectory = chat_run / "trajectory" / "llm_trajectory.jsonl"
    trajectory.write_bytes(trajectory.read_bytes() + b'{"request": {"timest')
    exported = _export(chat_run)
    assert exported["extra"]["reroll"]["truncated_line"] == 4
    assert len(exported["steps"]) == 5


def test_a_folder_that_is_no_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="not a run folder"):
        kind_of(tmp_path)


def test_a_graded_reward_and_its_step_events_reach_the_atif_steps(tmp_path: Path) -> None:
    result = {"rewards": {"reward": 0.5, "ran-tests": 1.0, "no-edits-to-tests": 0.0}, "verify_result": GRADED}
    run = write_run(tmp_path / "run", chat_exchanges(), result=result)
    data = _export(run)
    Trajectory.model_validate(data)  # the atif package's own check
    by_exchange = {step["extra"]["exchange"]: step for step in data["steps"] if step["source"] == "agent"}
    assert [event["source"] for event in by_exchange[0]["extra"]["reward_events"]] == ["ran-tests"]
    assert by_exchange[1]["extra"]["reward_events"][0]["reward"] == 0.0
    assert "reward_events" not in by_exchange[2]["extra"]  # no event names the last step
    graded = data["extra"]["reroll"]["verify_result"]
    assert (graded["items"], graded["events"][2]["step"], graded["space"]) == (
        GRADED["items"],
        None,
        "output",
    )


def test_a_weighted_reward_carries_its_items_method_and_weights(tmp_path: Path) -> None:
    data = _export(write_run(tmp_path / "run", chat_exchanges(), result=WEIGHTED_RESULT))
    reroll = data["extra"]["reroll"]
    assert reroll["rewards"]["reward"] == 0.4
    assert (reroll["verify_result"]["items"], reroll["verify_result"]["aggregate"]) == (
        WEIGHTED["items"],
        WEIGHTED["aggregate"],
    )


def test_the_judge_and_persona_trajectories_ride_in_extra_not_in_the_steps(chat_run: Path) -> None:
    write_side(chat_run, "judge", "Grade this diff.", '{"reward": 1}')
    write_side(
        chat_run, "user", "You are a terse user. The agent asks: which file?", "math.py", replayed=True
    )
    exported = _export(chat_run)
    assert len(exported["steps"]) == 5 and "subagent_trajectories" not in exported
    reroll = exported["extra"]["reroll"]
    sides = {name: Trajectory.model_validate(side) for name, side in reroll["side_trajectories"].items()}
    assert sorted(sides) == ["judge", "user"]
    user = sides["user"]
    assert user.trajectory_id == "run/user"
    assert user.agent.name == "user" and user.agent.model_name == "user-model"
    assert [step.message for step in user.steps] == [
        "You are a terse user. The agent asks: which file?",
        "math.py",
    ]
    assert user.steps[1].is_copied_context is True
    assert sides["judge"].steps[1].message == '{"reward": 1}'
    assert reroll["side_counts"]["user"] == {
        "exchanges": 1,
        "replayed": 1,
        "live": 0,
        "divergences": 0,
        "tokens": 114,
    }


def test_a_run_without_side_models_exports_none(chat_run: Path) -> None:
    reroll = _export(chat_run)["extra"]["reroll"]
    assert reroll["side_trajectories"] == {} and reroll["side_counts"] == {}


def test_a_corrupt_persona_trajectory_line_is_named(chat_run: Path) -> None:
    write_side(chat_run, "user", "Which file?", "math.py")
    side = chat_run / "trajectory" / "user_trajectory.jsonl"
    side.write_bytes(b'{"request": 1}\n' + side.read_bytes())
    with pytest.raises(TrajectoryFormatError, match=r"user_trajectory.jsonl: line 1: not an exchange"):
        list(export_lines(chat_run, "atif"))
