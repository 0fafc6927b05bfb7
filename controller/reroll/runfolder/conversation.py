"""A run's trajectory as conversations, the same whatever wire format the agent spoke (pure).

Each exchange's request is normalised by its API format (`WireFormat.normalise`) and its answer
too (`WireFormat.normalise_response`), so Chat Completions, Responses and Anthropic Messages
recordings of one conversation give the same `Turn` list.

Threads: an exchange continues the thread whose last request is a prefix of its own, or equal
to it (a retry); the
longest such; one that continues none starts a thread of its own (a subagent, a side call
such as a title or summary request). A Responses request chained with ``previous_response_id``
carries only new input, so it continues the thread it was last chained to — the main one.

Turns of one thread, in order: per exchange, first the messages its request adds to the
thread (after the assistant messages that repeat the previous answer): tool results become the
`Turn.results` of the previous agent turn (paired with its tool calls by position, since the
normal request form drops ids), system and user messages turns of their own; then the answer,
one ``agent`` turn. Exchanges without an answer (an error status, a reset connection) add no
turn and are counted in `Thread.failed_calls`.

What is lossy: the request side (system, user, tool-result text) comes from the normal request
form, whose text is stripped of leading and trailing whitespace and whose non-text blocks
(images, documents) are rendered as JSON; the agent's own turns are verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from reroll_contracts.trajectory import Exchange
from reroll_contracts.wire import WireFormat, format_named
from reroll_contracts.wire.normal import NormalUsage

TurnSource = Literal["system", "user", "agent"]


@dataclass
class ToolCallTurn:
    """One tool call of an agent turn."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    """The arguments object (a non-object value is wrapped as ``{"input": value}``)."""


@dataclass
class ToolResult:
    """What a tool call (or, without `call_id`, a non-tool action) returned."""

    call_id: str | None
    content: str
    is_error: bool = False


@dataclass
class Turn:
    """One system message, user message or agent answer."""

    source: TurnSource
    text: str
    exchange: Exchange
    """The exchange whose request (system / user) or response (agent) holds the turn."""
    replayed: bool
    """True when the exchange was served from a recording (the copied prefix of a continuation)."""
    reasoning: str | None = None
    tool_calls: list[ToolCallTurn] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    """The tool results the next request sent back (agent turns only)."""
    usage: NormalUsage | None = None
    stop_reason: str | None = None
    from_request: bool = False
    """An assistant message the agent put in its first request (few-shot, prefill), not an answer."""


@dataclass
class Thread:
    """One conversation of a run: the main agent's, or a subagent's / side call's."""

    index: int
    turns: list[Turn] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)
    """The tool definitions of the thread's first request, in the normal form."""
    exchanges: list[Exchange] = field(default_factory=list)
    failed_calls: int = 0
    """Exchanges of the thread without an answer (error status or no response)."""
    last_messages: list[dict[str, Any]] = field(default_factory=list)


def threads_of(exchanges: list[Exchange]) -> list[Thread]:
    """Split `exchanges` into threads (the first is the main one) and build their turns.

    Args:
        exchanges: a trajectory's exchanges, in file order.

    Returns:
        The threads, in the order their first exchange appears; none for no exchanges.

    Raises:
        KeyError: an exchange names an unknown API format.
    """
    threads: list[Thread] = []
    normaliser = _Normaliser()
    for exchange in exchanges:
        wire = format_named(exchange.metadata.api_format)
        body = exchange.request.body if isinstance(exchange.request.body, dict) else {}
        messages = normaliser.messages(wire, body)
        chained = bool(body.get("previous_response_id"))
        thread = _thread_for(threads, messages, chained)
        if thread is None:
            thread = Thread(index=len(threads), tools=wire.normalise(body)["tools"])
            threads.append(thread)
            new = messages
        else:
            new = messages if chained else _after_answer(messages[len(thread.last_messages) :])
        thread.exchanges.append(exchange)
        _add_inputs(thread, new, exchange, first=len(thread.exchanges) == 1)
        thread.last_messages = messages
        response = exchange.response
        if response.status_code != 200 or not isinstance(response.body, dict):
            thread.failed_calls += 1
            continue
        answer = wire.normalise_response(response.body)
        thread.turns.append(_agent_turn(answer["message"]["content"], exchange, answer["usage"]))
        thread.turns[-1].stop_reason = answer["stop_reason"]
    return threads


@dataclass
class _Normaliser:
    """`WireFormat.normalise`'s messages, reusing the previous request's when the conversation
    list extends the previous one's (agents resend the whole history with every request: without
    this the export would normalise a quadratic number of messages)."""

    wire: WireFormat | None = None
    head: list[dict[str, Any]] = field(default_factory=list)
    raw: list[Any] = field(default_factory=list)
    normal: list[dict[str, Any]] = field(default_factory=list)

    def messages(self, wire: WireFormat, body: dict[str, Any]) -> list[dict[str, Any]]:
        key = wire.conversation_key
        items = body.get(key)
        if not isinstance(items, list):
            self.wire = None
            return wire.normalise(body)["messages"]
        head = wire.normalise({**body, key: []})["messages"]
        known = len(self.raw)
        if wire is self.wire and head == self.head and items[:known] == self.raw:
            normal = self.normal + wire.normalise({key: items[known:]})["messages"]
        else:
            normal = wire.normalise(body)["messages"]
        self.wire, self.head, self.raw, self.normal = wire, head, items, normal
        return normal


def function_tool(tool: Any) -> dict[str, Any]:
    """An OpenAI function definition (``{"type": "function", "function": {...}}``) from a tool in
    the normal form; any other tool as it is (a non-object wrapped as ``{"value": tool}``)."""
    if isinstance(tool, dict) and set(tool) == {"name", "description", "parameters"}:
        return {
            "type": "function",
            "function": {key: value for key, value in tool.items() if value is not None},
        }
    return tool if isinstance(tool, dict) else {"value": tool}


def _thread_for(threads: list[Thread], messages: list[dict[str, Any]], chained: bool) -> Thread | None:
    if chained and threads:
        return threads[0]
    continued = [
        thread
        for thread in threads
        if len(thread.last_messages) <= len(messages)
        and messages[: len(thread.last_messages)] == thread.last_messages
    ]
    return max(continued, key=lambda thread: len(thread.last_messages), default=None)


def _after_answer(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` without the leading assistant messages (the previous answer, repeated)."""
    start = 0
    while start < len(messages) and messages[start].get("role") == "assistant":
        start += 1
    return messages[start:]


def _add_inputs(thread: Thread, messages: list[dict[str, Any]], exchange: Exchange, *, first: bool) -> None:
    replayed = exchange.metadata.source == "replayed"
    previous = next((turn for turn in reversed(thread.turns) if turn.source == "agent"), None)
    for message in messages:
        role = message.get("role")
        blocks = message.get("content") or []
        results = [
            block for block in blocks if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
        others = [block for block in blocks if block not in results]
        for result in results:
            if previous is None:
                others.append(result)
                continue
            calls = previous.tool_calls
            position = len(previous.results)
            call_id = calls[position].call_id if position < len(calls) else None
            content = _text(result.get("content") or [])
            previous.results.append(ToolResult(call_id, content, bool(result.get("is_error"))))
        if not others:
            continue
        if role == "assistant" and first:
            turn = _agent_turn(others, exchange, None)
            turn.from_request = True
            thread.turns.append(turn)
        elif role in ("system", "user"):
            thread.turns.append(Turn(source=role, text=_text(others), exchange=exchange, replayed=replayed))
        else:
            thread.turns.append(Turn(source="user", text=_text(others), exchange=exchange, replayed=replayed))


def _agent_turn(blocks: list[Any], exchange: Exchange, usage: NormalUsage | None) -> Turn:
    thinking = [
        block["text"] for block in blocks if isinstance(block, dict) and block.get("type") == "thinking"
    ]
    calls = [
        ToolCallTurn(
            call_id=str(block.get("id") or f"call-{exchange.metadata.step}-{number}"),
            name=str(block.get("name")),
            arguments=block["arguments"]
            if isinstance(block.get("arguments"), dict)
            else {"input": block.get("arguments")},
        )
        for number, block in enumerate(
            b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_call"
        )
    ]
    said = [
        block
        for block in blocks
        if not (isinstance(block, dict) and block.get("type") in ("thinking", "tool_call"))
    ]
    return Turn(
        source="agent",
        text=_text(said),
        exchange=exchange,
        replayed=exchange.metadata.source == "replayed",
        reasoning="\n\n".join(thinking) if thinking else None,
        tool_calls=calls,
        usage=usage,
    )


def _text(blocks: list[Any]) -> str:
    """Text blocks' text joined with blank lines; any other block as JSON."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            parts.append(_text(block.get("content") or []))
        else:
            parts.append(orjson.dumps(block).decode())
    return "\n\n".join(part for part in parts if part)
