"""Cross-format model swap end to end: real mini-swe-agent (it speaks OpenAI Chat Completions)
recorded on the scripted model, then continued from step 2 by the scripted model served only
over Anthropic Messages (``scripted-anthropic``) or only over OpenAI Responses
(``scripted-responses``); the proxy translates both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

pytestmark = pytest.mark.slow
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"


@pytest.mark.parametrize(
    ("live_model", "upstream_format", "call_id_prefix"),
    [
        ("scripted-anthropic", "anthropic-messages", "toolu_"),
        ("scripted-responses", "openai-responses", "call_"),
    ],
    ids=["anthropic", "responses"],
)
def test_a_chat_agent_is_continued_by_a_model_of_another_api(
    tmp_path: Path, live_model: str, upstream_format: str, call_id_prefix: str
) -> None:
    script = yaml.safe_load((TASK / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn.pop("delay_seconds", None)  # the task's marked turn exists for timeout demos only
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script))
    done = reroll(
        "run", str(TASK.resolve()), "--agent", "mini-swe-agent", "--model", "scripted:script.yaml",
        "--jobs-dir", "jobs", "--job-name", "record", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = only_folder(tmp_path / "jobs" / "record")
    assert read_json(recorded / "result.json")["rewards"] == {"reward": 1.0}
    original = trajectory(recorded)
    assert len(original) == 5 and {line["metadata"]["upstream_format"] for line in original} == {None}

    done = reroll(
        "continue", str(recorded), "--at", "2", "--model", f"{live_model}:script.yaml",
        "--timeout", "120", "--output", "swapped", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    swapped = only_folder(tmp_path / "swapped")
    result = read_json(swapped / "result.json")
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"].items() >= {"exchanges": 5, "replayed": 2, "live": 3, "divergences": 0}.items()
    lines = trajectory(swapped)
    assert [line["metadata"]["source"] for line in lines] == ["replayed"] * 2 + ["live"] * 3
    assert [line["metadata"]["api_format"] for line in lines] == ["openai-chat"] * 5
    assert [line["metadata"]["upstream_format"] for line in lines] == [None] * 2 + [upstream_format] * 3
    for line in lines[2:]:  # recorded as the agent sent and received it
        assert line["request"]["path"] == "/v1/chat/completions"
        assert line["response"]["body"]["object"] == "chat.completion"
        calls = line["response"]["body"]["choices"][0]["message"]["tool_calls"]
        assert calls[0]["id"].startswith(call_id_prefix)  # ids minted by the upstream
    assert read_json(swapped / "config.json")["continued_from"]["live_model"].startswith(f"{live_model}:")
