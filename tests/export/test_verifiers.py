"""`reroll export --format verifiers`: RolloutOutput-shaped records of runs, jobs and trees."""

from __future__ import annotations

from pathlib import Path

import orjson
from reroll.export import export_lines
from reroll.export.verifiers import RolloutRecord
from reroll.runfolder.folders import kind_of

from tests.export.conftest import (
    GRADED,
    SYSTEM,
    TASK,
    WEIGHTED,
    WEIGHTED_RESULT,
    chat_exchanges,
    in_format,
    write_run,
    write_side,
)


def _records(path: Path) -> list[RolloutRecord]:
    return [
        RolloutRecord.model_validate_json(line)
        for line in b"".join(export_lines(path, "verifiers")).splitlines()
    ]


def test_prompt_is_what_precedes_the_first_answer(chat_run: Path) -> None:
    (record,) = _records(chat_run)
    assert record.prompt == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    roles = [message["role"] for message in record.completion]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]
    call = record.completion[0]["tool_calls"][0]
    assert call["id"] == "call_0" and orjson.loads(call["function"]["arguments"]) == {
        "command": "cat test_math.py"
    }
    assert record.completion[1] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": "def test_add(): assert add(1, 2) == 3",
    }
    assert record.reward == 1.0 and record.metrics == {"reward": 1.0}
    assert not record.is_truncated
    assert record.info["agent"] == "tool-agent" and record.info["model"] == "gpt-test"
    assert record.tools is not None and record.tools[0]["function"]["name"] == "bash"


def test_every_wire_format_gives_the_same_record(tmp_path: Path) -> None:
    records = []
    for fmt in ("openai-chat", "openai-responses", "anthropic-messages"):
        (record,) = _records(write_run(tmp_path / fmt, in_format(fmt), api_format=fmt))
        records.append(record.model_dump(exclude={"info"}))
    assert records[0] == records[1] == records[2]


def test_a_timed_out_continuation_is_truncated_and_counts_its_copied_messages(tmp_path: Path) -> None:
    continued_from = {
        "path": "/orig",
        "status": "timeout",
        "cut_index": 2,
        "original_model": "a",
        "live_model": "b",
    }
    run = write_run(
        tmp_path / "run",
        chat_exchanges(),
        replayed=2,
        config={"continued_from": continued_from},
        result={"status": "timeout", "error_category": "timeout", "rewards": None},
    )
    (record,) = _records(run)
    assert record.is_truncated and record.stop_condition == "timeout"
    assert record.reward is None and record.metrics == {}
    assert record.info["copied_completion_messages"] == 4  # two answers and their tool results
    assert record.info["continued_from"]["cut_index"] == 2


def test_a_job_gives_one_record_per_rollout_grouped_by_task(tmp_path: Path) -> None:
    job = tmp_path / "job"
    write_run(job / "fix__a__m__r0", chat_exchanges())
    write_run(job / "fix__a__m__r1", chat_exchanges(), result={"rewards": {"reward": 0.0}})
    write_run(job / "other__a__m__r0", chat_exchanges(), config={"task_name": "other"})
    write_run(job / "_attempts" / "fix__a__m__r0", chat_exchanges())
    (job / "job.json").write_text("{}")
    assert kind_of(job) == "job"
    records = _records(job)
    assert [(r.task, r.example_id, r.reward) for r in records] == [
        ("fix", 0, 1.0),
        ("fix", 0, 0.0),
        ("other", 1, 1.0),
    ]


def test_a_graded_rewards_items_are_metrics_and_its_events_are_info(tmp_path: Path) -> None:
    result = {"rewards": {"reward": 0.5, "ran-tests": 1.0, "no-edits-to-tests": 0.0}, "verify_result": GRADED}
    (record,) = _records(write_run(tmp_path / "run", chat_exchanges(), result=result))
    assert (record.reward, record.metrics) == (
        0.5,
        {"reward": 0.5, "ran-tests": 1.0, "no-edits-to-tests": 0.0},
    )
    events = record.info["verify_result"]["events"]
    assert [(event["source"], event["step"], event["space"]) for event in events[:2]] == [
        ("ran-tests", 0, "action"),
        ("no-edits-to-tests", 1, "action"),
    ]


def test_a_weighted_reward_carries_its_items_method_and_weights(tmp_path: Path) -> None:
    (record,) = _records(write_run(tmp_path / "run", chat_exchanges(), result=WEIGHTED_RESULT))
    assert (record.reward, record.metrics["docs"]) == (0.4, 1.0)
    assert record.info["verify_result"]["aggregate"] == WEIGHTED["aggregate"]


def test_the_persona_and_judge_conversations_are_in_info_not_the_completion(chat_run: Path) -> None:
    (plain,) = _records(chat_run)
    write_side(chat_run, "user", "The agent asks: which file?", "math.py")
    write_side(chat_run, "judge", "Grade this diff.", '{"reward": 1}')
    (record,) = _records(chat_run)
    assert (record.prompt, record.completion) == (plain.prompt, plain.completion)
    assert record.info["side_conversations"] == {
        "judge": [
            {"role": "user", "content": "Grade this diff."},
            {"role": "assistant", "content": '{"reward": 1}'},
        ],
        "user": [
            {"role": "user", "content": "The agent asks: which file?"},
            {"role": "assistant", "content": "math.py"},
        ],
    }
    assert record.info["side_counts"]["judge"]["exchanges"] == 1
    assert plain.info["side_conversations"] == {} and plain.info["side_counts"] == {}
