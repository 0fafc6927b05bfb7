"""A run folder as an ATIF v1.8 trajectory, built and validated with the `atif` package's models.

ATIF (Agent Trajectory Interchange Format) is Harbor's: the spec is
https://github.com/harbor-framework/harbor/blob/main/rfcs/0001-trajectory-format.md, the
pydantic models are PyPI's ``atif`` (the same as Harbor's).

What maps to what:

- the main thread (`reroll.runfolder.conversation`) gives ``steps``: a system or user message a
  ``system`` / ``user`` step, an answer an ``agent`` step with ``message`` (its text),
  ``reasoning_content`` (its thinking), ``tool_calls`` (with the provider's call ids),
  ``observation`` (the tool results the next request sent back, ``source_call_id`` = the call
  id), ``metrics`` (prompt / completion / cached tokens from ``usage``), ``llm_call_count`` 1,
  ``model_name`` (the model that answered), ``timestamp`` (when the response was complete);
  an assistant message the agent wrote into its first request is an agent step with
  ``llm_call_count`` 0;
- the replayed prefix of a continuation or a branch is ``is_copied_context`` (consumers drop it
  from training data: the answers were copied from the original run);
- other threads (subagents, side calls) are ``subagent_trajectories``, ``trajectory_id``
  ``<run>/thread-<k>``;
- ``agent``: name, version (config.json's ``agent_version`` if any, else ``unknown``), model,
  ``tool_definitions`` (OpenAI function definitions from the first request);
- ``final_metrics``: token sums over agent steps, ``total_steps``;
- ``extra.reroll``: task, status, rewards (and ``verify_result``), error, counts, the provenance
  (``continued_from`` / ``branched_from``: the original run's folder and the cut), and the
  learner store generation the run started from (``learner_store``: path, generation,
  writes_back; a sequential-shared job's rollout or a continuation of one, else null). ATIF's own
  ``continued_trajectory_ref`` points forward (from a trajectory to the one that continues it),
  so a continuation's link back to its original is in ``extra.reroll.continued_from``;
- per step ``extra``: the exchange's index, source, duration and time to first byte (ms), its
  divergence and injected fault, if any, and ``reward_events``: the events of result.json's
  ``verify_result`` whose ``step`` is that exchange (ATIF has no reward field of its own);
- ``extra.reroll.verify_result``: the structured reward (items, events, space, granularity);
- ``extra.reroll.side_trajectories``: the models beside the agent (`SIDE_TRAJECTORIES`: ``judge``,
  ``user`` for a persona User), each an ATIF trajectory of its own (``agent.name`` the key,
  ``trajectory_id`` ``<run>/<key>``), those the run recorded; kept out of ``steps`` and
  ``subagent_trajectories`` (they are not the agent's, consumers must not train on them as such).
  ``extra.reroll.side_counts``: their result.json counts (exchanges by source, divergences).
"""

from __future__ import annotations

from typing import Any

from atif import (
    Agent,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from pydantic import ValidationError
from reroll_contracts.errors import ExportError
from reroll_contracts.trajectory import Exchange

from reroll.runfolder.conversation import Thread, Turn, function_tool, threads_of
from reroll.runfolder.run import RunFolder

SCHEMA_VERSION = "ATIF-v1.8"


def run_to_atif(run: RunFolder) -> Trajectory:
    """The ATIF trajectory of one run folder (see the module docstring for the mapping), with its
    side trajectories (`reroll.runfolder.run.SIDE_TRAJECTORIES`) in ``extra.reroll``.

    Args:
        run: a loaded run folder.

    Returns:
        The validated trajectory.

    Raises:
        ExportError: the trajectory (or a side trajectory) names an unknown API format, or the result does not
            validate as ATIF (the message names the run folder and the cause).
    """
    name = run.path.name
    try:
        trajectory = _conversation(run, run.exchanges, trajectory_id=name, side=None)
        if trajectory.extra is not None:
            trajectory.extra["reroll"]["side_trajectories"] = {
                side: _conversation(
                    run, loaded.exchanges, trajectory_id=f"{name}/{side}", side=side
                ).to_json_dict()
                for side, loaded in run.sides.items()
            }
        return Trajectory.model_validate(trajectory.model_dump())
    except ValidationError as exc:
        raise ExportError(f"{run.path}: not valid ATIF: {exc}") from exc


def _conversation(
    run: RunFolder, exchanges: list[Exchange], *, trajectory_id: str, side: str | None
) -> Trajectory:
    """The trajectory of `exchanges`: the agent's (`side` None) or a side model's (its key in
    `SIDE_TRAJECTORIES`); threads after the first are its ``subagent_trajectories``."""
    try:
        threads = threads_of(exchanges)
    except KeyError as exc:
        raise ExportError(f"{run.path}: {exc.args[0]}") from exc
    main = threads[0] if threads else Thread(index=0)
    trajectory = _trajectory(run, main, trajectory_id=trajectory_id, side=side)
    subagents = [
        _trajectory(run, thread, trajectory_id=f"{trajectory_id}/thread-{thread.index}", side=side)
        for thread in threads[1:]
    ]
    if subagents:
        trajectory.subagent_trajectories = subagents
    return trajectory


def _trajectory(run: RunFolder, thread: Thread, *, trajectory_id: str, side: str | None) -> Trajectory:
    config = run.config
    events = step_events(run) if side is None else {}
    steps = [_step(number, turn, events) for number, turn in enumerate(thread.turns, start=1)]
    agent_steps = [step for step in steps if step.metrics is not None]
    models = [exchange.metadata.model for exchange in thread.exchanges if exchange.metadata.model]
    return Trajectory(
        schema_version=SCHEMA_VERSION,
        session_id=run.path.name,
        trajectory_id=trajectory_id,
        agent=Agent(
            name=config.agent if side is None else side,
            version=str(getattr(config, "agent_version", None) or "unknown") if side is None else "unknown",
            model_name=config.model if side is None else next(iter(models), None),
            tool_definitions=[function_tool(tool) for tool in thread.tools] or None,
        ),
        steps=steps,
        final_metrics=FinalMetrics(
            total_prompt_tokens=_total(agent_steps, "prompt_tokens"),
            total_completion_tokens=_total(agent_steps, "completion_tokens"),
            total_cached_tokens=_total(agent_steps, "cached_tokens"),
            total_steps=len(steps),
            extra={"failed_llm_calls": thread.failed_calls, "exchanges": len(thread.exchanges)},
        ),
        extra={"reroll": _provenance(run)} if thread.index == 0 and side is None else None,
    )


def step_events(run: RunFolder) -> dict[int, list[dict[str, Any]]]:
    """The reward events of the run's ``verify_result`` that name a step, by that step (the
    exchange's ``metadata.step``), as JSON."""
    graded = run.result.verify_result if run.result is not None else None
    found: dict[int, list[dict[str, Any]]] = {}
    for event in graded.events if graded is not None else []:
        if event.step is not None:
            found.setdefault(event.step, []).append(event.model_dump(mode="json"))
    return found


def _step(number: int, turn: Turn, events: dict[int, list[dict[str, Any]]]) -> Step:
    metadata = turn.exchange.metadata
    copied = True if turn.replayed else None
    if turn.source != "agent":
        return Step(
            step_id=number,
            timestamp=turn.exchange.request.timestamp,
            source=turn.source,
            message=turn.text,
            is_copied_context=copied,
            extra={"exchange": metadata.step},
        )
    if turn.from_request:
        return Step(
            step_id=number,
            source="agent",
            message=turn.text,
            tool_calls=[_tool_call(call) for call in turn.tool_calls] or None,
            llm_call_count=0,
            is_copied_context=copied,
            extra={"exchange": metadata.step, "from_request": True},
        )
    usage = turn.usage or {"prompt_tokens": None, "completion_tokens": None, "cached_tokens": None}
    return Step(
        step_id=number,
        timestamp=turn.exchange.response.timestamp,
        source="agent",
        model_name=metadata.model,
        message=turn.text,
        reasoning_content=turn.reasoning,
        tool_calls=[_tool_call(call) for call in turn.tool_calls] or None,
        observation=Observation(results=[_result(result) for result in turn.results])
        if turn.results
        else None,
        metrics=Metrics(
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            cached_tokens=usage["cached_tokens"],
        ),
        llm_call_count=1,
        is_copied_context=copied,
        extra=_step_extra(turn, events.get(metadata.step, []) if metadata.step is not None else []),
    )


def _step_extra(turn: Turn, events: list[dict[str, Any]]) -> dict[str, Any]:
    metadata = turn.exchange.metadata
    extra: dict[str, Any] = {
        "exchange": metadata.step,
        "source": metadata.source,
        "api_format": metadata.api_format,
        "duration_ms": turn.exchange.duration_ms,
        "ttfb_ms": metadata.ttfb_ms,
        "stop_reason": turn.stop_reason,
    }
    if metadata.divergence is not None:
        extra["divergence"] = metadata.divergence.model_dump(mode="json")
    if metadata.fault is not None:
        extra["fault"] = metadata.fault.model_dump(mode="json")
    if events:
        extra["reward_events"] = events
    return extra


def _tool_call(call: Any) -> ToolCall:
    return ToolCall(tool_call_id=call.call_id, function_name=call.name, arguments=call.arguments)


def _result(result: Any) -> ObservationResult:
    return ObservationResult(
        source_call_id=result.call_id,
        content=result.content,
        extra={"is_error": True} if result.is_error else None,
    )


def _total(steps: list[Step], key: str) -> int | None:
    values = [getattr(step.metrics, key) for step in steps if step.metrics is not None]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _provenance(run: RunFolder) -> dict[str, Any]:
    """What the run was and how it ended, and where it came from."""
    config, result = run.config, run.result
    return {
        "run_folder": str(run.path),
        "task": config.task_name or config.task_path,
        "task_path": config.task_path,
        "sandbox": config.sandbox,
        "skill_mode": config.skill_mode,
        "skills_opened": result.skills_opened if result is not None else None,
        "status": result.effective_status if result is not None else "unknown",
        "rewards": result.rewards if result is not None else None,
        "verify_result": result.verify_result.model_dump(mode="json")
        if result is not None and result.verify_result is not None
        else None,
        "error": result.error if result is not None else None,
        "error_category": result.error_category if result is not None else None,
        "continued_from": config.continued_from.model_dump(mode="json") if config.continued_from else None,
        "branched_from": config.branched_from.model_dump(mode="json") if config.branched_from else None,
        "learner_store": config.learner_store.model_dump(mode="json") if config.learner_store else None,
        "truncated_line": run.trajectory.truncated_line,
        "side_counts": run.side_counts_json(),
    }
