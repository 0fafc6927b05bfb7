"""Run folders with one conversation recorded in each of the three wire formats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from reroll.runfolder.run import SIDE_TRAJECTORIES, RunConfig, RunResult, count_exchanges, write_json
from reroll.runfolder.summary import BranchSummary, ChildSummary, ModelSummary
from reroll_contracts.trajectory import Exchange, load_trajectory
from reroll_proxy import chat_anthropic, responses_chat

SYSTEM = "You are a careful engineer."
TASK = "Fix the failing test."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
COMMANDS = ["cat test_math.py", "sed -i 's/a - b/a + b/' math.py"]
OUTPUTS = ["def test_add(): assert add(1, 2) == 3", ""]


GRADED: dict[str, Any] = {
    "reward": 0.5,
    "items": {"ran-tests": 1.0, "no-edits-to-tests": 0.0},
    "events": [
        {"source": "ran-tests", "reward": 1.0, "step": 0, "space": "action", "granularity": "step"},
        {"source": "no-edits-to-tests", "reward": 0.0, "step": 1, "space": "action", "granularity": "step"},
        {"source": "answer", "reward": 0.5, "note": "whole run"},
    ],
}
"""A structured reward.json's content (`reroll_contracts.reward.VerifyResult`): two step events."""
WEIGHTED: dict[str, Any] = {
    "reward": 0.4,
    "items": {"tests": 1.0, "lint": 0.0, "docs": 1.0, "style": 0.0},
    "aggregate": {
        "method": "weighted_mean",
        "value": 0.4,
        "weights": {"tests": 0.3, "lint": 0.3, "docs": 0.1, "style": 0.3},
        "threshold": None,
    },
}
"""result.json's ``verify_result`` for BenchFlow's graded form (`reroll_contracts.graded`): four
weighted items, two passed."""
WEIGHTED_RESULT: dict[str, Any] = {
    "rewards": {"reward": 0.4, "tests": 1.0, "lint": 0.0, "docs": 1.0, "style": 0.0}
}
WEIGHTED_RESULT["verify_result"] = WEIGHTED


def _completion(index: int) -> dict[str, Any]:
    """The chat completion of step `index`: a tool call per command, then a final answer."""
    usage: dict[str, Any] = {
        "prompt_tokens": 100 + index,
        "completion_tokens": 10 + index,
        "total_tokens": 110 + 2 * index,
    }
    usage["prompt_tokens_details"] = {"cached_tokens": 0}
    if index < len(COMMANDS):
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "bash", "arguments": orjson.dumps({"command": COMMANDS[index]}).decode()},
        }
        message: dict[str, Any] = {"role": "assistant", "content": f"Step {index}.", "tool_calls": [call]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": "Done: the test passes."}, "stop"
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def chat_exchanges() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request, response) pairs of one Chat Completions conversation with two tool calls."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    pairs = []
    for index in range(len(COMMANDS) + 1):
        request = {"model": "gpt-test", "messages": [dict(m) for m in messages], "tools": TOOLS}
        completion = _completion(index)
        pairs.append((request, completion))
        answer = completion["choices"][0]["message"]
        messages.append(answer)
        for call in answer.get("tool_calls", []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": OUTPUTS[index]})
    return pairs


_PATHS = {
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "anthropic-messages": "/v1/messages",
}


def in_format(api_format: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """`chat_exchanges` translated into `api_format` by the proxy's own translators."""
    pairs = chat_exchanges()
    if api_format == "anthropic-messages":
        return [
            (chat_anthropic.chat_to_messages(r), chat_anthropic.completion_to_message(c)) for r, c in pairs
        ]
    if api_format == "openai-responses":
        return [
            (responses_chat.chat_to_responses(r), responses_chat.completion_to_response(c)) for r, c in pairs
        ]
    return pairs


def exchange_lines(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    api_format: str = "openai-chat",
    replayed: int = 0,
    model: str = "gpt-test",
) -> bytes:
    """`pairs` as trajectory lines (one exchange each, the first `replayed` marked replayed,
    `model` answering)."""
    lines = b""
    for step, (request, response) in enumerate(pairs):
        exchange = Exchange.model_validate(
            {
                "request": {
                    "timestamp": f"2026-01-01T00:00:{step:02d}+00:00",
                    "path": _PATHS[api_format],
                    "body": request,
                },
                "response": {
                    "timestamp": f"2026-01-01T00:00:{step:02d}.5+00:00",
                    "status_code": 200,
                    "body": response,
                },
                "duration_ms": 500.0,
                "metadata": {
                    "step": step,
                    "source": "replayed" if step < replayed else "live",
                    "model": model,
                    "api_format": api_format,
                },
            }
        )
        lines += exchange.to_line()
    return lines


def write_side(folder: Path, side: str, question: str, answer: str, *, replayed: bool = False) -> None:
    """Record one exchange of the side model `side` (``judge``, ``user``) in run `folder`: `question`
    asked, `answer` given (a Chat completion), and its counts in result.json."""
    completion = _completion(len(COMMANDS))
    completion["choices"][0]["message"]["content"] = answer
    request = {"model": f"{side}-model", "messages": [{"role": "user", "content": question}]}
    lines = exchange_lines([(request, completion)], replayed=1 if replayed else 0, model=f"{side}-model")
    (folder / SIDE_TRAJECTORIES[side]).write_bytes(lines)
    result = RunResult.model_validate_json((folder / "result.json").read_bytes())
    setattr(result, f"{side}_counts", count_exchanges(load_trajectory(folder / SIDE_TRAJECTORIES[side])))
    write_json(folder / "result.json", result)


def write_run(
    folder: Path,
    pairs: list[tuple[dict[str, Any], dict[str, Any]]],
    *,
    api_format: str = "openai-chat",
    replayed: int = 0,
    config: dict[str, Any] | None = None,
    result: dict[str, Any] | None = None,
) -> Path:
    """A run folder holding `pairs` as exchanges (the first `replayed` marked replayed)."""
    (folder / "trajectory").mkdir(parents=True)
    (folder / "trajectory" / "llm_trajectory.jsonl").write_bytes(exchange_lines(pairs, api_format, replayed))
    write_json(
        folder / "config.json",
        RunConfig.model_validate(
            {
                "task_path": "/tasks/fix",
                "task_name": "fix",
                "agent": "tool-agent",
                "model": "gpt-test",
                **(config or {}),
            }
        ),
    )
    write_json(
        folder / "result.json",
        RunResult.model_validate({"status": "ok", "rewards": {"reward": 1.0}, **(result or {})}),
    )
    write_json(folder / "prompts.json", [TASK])
    return folder


def write_tree(tree: Path, rewards: list[float]) -> Path:
    """A branch tree (as `reroll.jobs.branch` writes it): a two-exchange parent and one child of
    model ``gpt-test`` per reward, each replaying the first two exchanges of `chat_exchanges`."""
    write_run(tree, chat_exchanges()[:2])
    children = []
    for index, reward in enumerate(rewards):
        name = f"gpt-test__{index}"
        branched = {
            "path": str(tree),
            "status": "ok",
            "cut_index": 2,
            "original_model": "gpt-test",
            "live_model": "gpt-test",
            "branch_index": index,
        }
        write_run(
            tree / name,
            chat_exchanges(),
            replayed=2,
            config={"branched_from": branched},
            result={"rewards": {"reward": reward}},
        )
        children.append(
            ChildSummary(
                folder=name,
                model="gpt-test",
                branch_index=index,
                status="ok",
                reward=reward,
                rewards={"reward": reward},
            )
        )
    mean = sum(rewards) / len(rewards)
    model = ModelSummary(model="gpt-test", branches=len(rewards), scored=len(rewards), mean_reward=mean)
    write_json(
        tree / "summary.json",
        BranchSummary(
            parent=str(tree), original="/orig", cut_index=2, at="2", children=children, models=[model]
        ),
    )
    return tree


@pytest.fixture
def chat_run(tmp_path: Path) -> Path:
    """A run folder of `chat_exchanges` in Chat Completions."""
    return write_run(tmp_path / "run", chat_exchanges())
