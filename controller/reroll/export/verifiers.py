"""A run folder as a verifiers rollout record: one ``RolloutOutput``-shaped JSON object.

The shape is verifiers' ``RolloutOutput`` TypedDict (``verifiers/types.py`` of
PrimeIntellect-ai/verifiers, the records ``vf-eval`` saves one per line in ``results.jsonl``):
``example_id``, ``prompt``, ``completion``, ``answer``, ``task``, ``info``, ``tools``,
``reward``, ``metrics``, ``stop_condition``, ``is_truncated``, ``timing``, ``error``.
`RolloutRecord` mirrors it with pydantic (verifiers itself is not a dependency: its 0.4 release
on PyPI ships only the newer ``verifiers.v1`` trace and pulls numpy, mcp and the prime-*
clients).

What maps to what: the main thread's turns (`reroll.runfolder.conversation`) become OpenAI Chat
messages (an agent turn an ``assistant`` message with ``tool_calls`` and, if any,
``reasoning_content``; its tool results ``tool`` messages with their ``tool_call_id``);
``prompt`` is every message before the first ``assistant`` one, ``completion`` the rest;
``reward`` the primary reward (``rewards.reward``, else the only entry; None without one),
``metrics`` all of ``rewards`` (a graded reward's items among them); ``is_truncated`` true
when the agent timed out;
``stop_condition`` the status; ``info``: task, agent, model, status, error category, exchange
counts, the number of leading completion messages copied from an original run
(``copied_completion_messages``: its replayed prefix), the provenance, the learner store
generation the run started from (``learner_store``: path, generation, writes_back; else null),
``verify_result`` (result.json's structured reward: items, events with the step they refer
to, space, granularity), ``side_conversations`` (the first thread of each model beside the agent,
`reroll.runfolder.run.SIDE_TRAJECTORIES`: ``judge``, ``user`` for a persona User, as Chat messages;
kept out of ``prompt`` / ``completion``) and ``side_counts`` (their result.json counts).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from reroll_contracts.trajectory import Exchange

from reroll.runfolder.conversation import Turn, function_tool, threads_of
from reroll.runfolder.run import RunFolder
from reroll.runfolder.summary import primary_reward


class RolloutTiming(BaseModel):
    """verifiers' ``RolloutTiming``: when the rollout started (Unix seconds) and its phases (ms)."""

    model_config = ConfigDict(extra="forbid")
    start_time: float | None = None
    generation_ms: float | None = None
    scoring_ms: float | None = None
    total_ms: float | None = None


class RolloutRecord(BaseModel):
    """verifiers' ``RolloutOutput``, field for field (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    example_id: int
    """The task's index in the export (rollouts of one task share it: a GRPO group)."""
    prompt: list[dict[str, Any]]
    completion: list[dict[str, Any]]
    answer: str = ""
    task: str
    info: dict[str, Any] = Field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    reward: float | None
    metrics: dict[str, float] = Field(default_factory=dict)
    stop_condition: str | None = None
    is_truncated: bool = False
    timing: RolloutTiming = Field(default_factory=RolloutTiming)
    error: str | None = None


def run_to_record(run: RunFolder, *, example_id: int, info: dict[str, Any] | None = None) -> RolloutRecord:
    """The verifiers record of one run folder.

    Args:
        run: a loaded run folder.
        example_id: the task's index among the exported tasks.
        info: more entries for ``info`` (a branch's checkpoint value estimate).

    Returns:
        The record.

    Raises:
        KeyError: an exchange (the agent's or a side model's) names an unknown API format.
    """
    threads = threads_of(run.exchanges)
    messages, copied = _chat(threads[0].turns if threads else [])
    first_answer = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    config, result = run.config, run.result
    status = result.effective_status if result is not None else "unknown"
    rewards = result.rewards if result is not None else None
    timings = result.timings if result is not None else None
    tools = threads[0].tools if threads else []
    return RolloutRecord(
        example_id=example_id,
        prompt=messages[:first_answer],
        completion=messages[first_answer:],
        task=config.task_name or config.task_path,
        info={
            "task_path": config.task_path,
            "agent": config.agent,
            "model": config.model,
            "status": status,
            "skill_mode": config.skill_mode,
            "error_category": result.error_category if result is not None else None,
            "run_folder": str(run.path),
            "exchanges": len(run.exchanges),
            "copied_completion_messages": max(0, copied - first_answer),
            "continued_from": config.continued_from.model_dump(mode="json")
            if config.continued_from
            else None,
            "branched_from": config.branched_from.model_dump(mode="json") if config.branched_from else None,
            "learner_store": config.learner_store.model_dump(mode="json") if config.learner_store else None,
            "verify_result": result.verify_result.model_dump(mode="json")
            if result is not None and result.verify_result is not None
            else None,
            "side_conversations": {side: _side_chat(loaded.exchanges) for side, loaded in run.sides.items()},
            "side_counts": run.side_counts_json(),
            **(info or {}),
        },
        tools=[function_tool(tool) for tool in tools] or None,
        reward=primary_reward(rewards),
        metrics=dict(rewards or {}),
        stop_condition=status,
        is_truncated=status == "timeout",
        timing=RolloutTiming(
            generation_ms=_ms(timings.agent_seconds) if timings else None,
            scoring_ms=_ms(timings.verifier_seconds) if timings else None,
            total_ms=_ms(timings.total_seconds) if timings else None,
        ),
        error=result.error if result is not None else None,
    )


def _chat(turns: list[Turn]) -> tuple[list[dict[str, Any]], int]:
    """`turns` as OpenAI Chat messages, and how many of them were replayed (copied)."""
    messages: list[dict[str, Any]] = []
    copied = 0
    for turn in turns:
        added = _messages(turn)
        messages += added
        copied += len(added) if turn.replayed else 0
    return messages, copied


def _side_chat(exchanges: list[Exchange]) -> list[dict[str, Any]]:
    """The first thread of a side trajectory as OpenAI Chat messages."""
    threads = threads_of(exchanges)
    return _chat(threads[0].turns if threads else [])[0]


def _messages(turn: Turn) -> list[dict[str, Any]]:
    if turn.source != "agent":
        return [{"role": turn.source, "content": turn.text}]
    answer: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.reasoning is not None:
        answer["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        answer["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": orjson.dumps(call.arguments).decode()},
            }
            for call in turn.tool_calls
        ]
    results = [
        {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
        if result.call_id is not None
        else {"role": "user", "content": result.content}
        for result in turn.results
    ]
    return [answer, *results]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
