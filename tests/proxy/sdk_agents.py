"""Tiny tool-calling agents, one per API format, that drive the official SDKs as real clients.

Each agent runs `conversation` turns against a base URL: one SDK call per turn (streamed through
the SDK's stream helper, which accumulates and checks the events, or not), then the answer and
a tool result per tool call go back into the history, as a real agent would do. The final
object of every turn is kept (``model_dump``) so a replay can be compared with its recording.
The sync and async clients share everything but the one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai

AGENT_MODEL = "gpt-test"
SYSTEM = "You are a test agent."
TASK = "List the files."
TOOL_PARAMETERS = {"type": "object", "properties": {"command": {"type": "string"}}}


@dataclass
class Transcript:
    """What an agent received."""

    finals: list[dict[str, Any]] = field(default_factory=list)
    """The final object of each turn (``model_dump``)."""
    events: list[int] = field(default_factory=list)
    """Stream events received per turn (0 for non-streamed turns)."""


Call = Callable[[dict[str, Any], bool], Awaitable[tuple[dict[str, Any], int]]]
"""One SDK call: (request params, stream) -> (final object, events received)."""


class Agent:
    """A format's agent loop; subclasses say how to call the SDK and extend the history."""

    def __init__(self, base_url: str | None, token: str, *, use_async: bool, max_retries: int = 0) -> None:
        self.use_async = use_async
        self.client: Any = self.make_client(base_url, token, use_async, max_retries)
        self.history: list[dict[str, Any]] = []

    def make_client(self, base_url: str | None, token: str, use_async: bool, max_retries: int) -> Any:
        """The SDK client; `base_url` None: the SDK's default, the provider's real URL."""
        kind = openai.AsyncOpenAI if use_async else openai.OpenAI
        return kind(base_url=base_url, api_key=token, max_retries=max_retries, timeout=30)

    async def run(self, turns: int, *, stream: bool, task: str = TASK) -> Transcript:
        """`turns` turns of the loop."""
        self.start(task)
        transcript = Transcript()
        try:
            for _ in range(turns):
                final, events = await self.call(self.params(), stream)
                transcript.finals.append(final)
                transcript.events.append(events)
                self.answer(final)
        finally:
            closed = self.client.close()
            if asyncio.iscoroutine(closed):
                await closed
        return transcript

    async def call(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if self.use_async:
            return await self.call_async(params, stream)
        return await asyncio.to_thread(self.call_sync, params, stream)

    def start(self, task: str) -> None:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        raise NotImplementedError

    def answer(self, final: dict[str, Any]) -> None:
        raise NotImplementedError

    def call_sync(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        raise NotImplementedError

    async def call_async(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        raise NotImplementedError


class ChatAgent(Agent):
    """OpenAI Chat Completions: ``chat.completions.create`` / ``chat.completions.stream``."""

    def start(self, task: str) -> None:
        self.history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]

    def params(self) -> dict[str, Any]:
        tool = {"type": "function", "function": {"name": "bash", "parameters": TOOL_PARAMETERS}}
        return {"model": AGENT_MODEL, "messages": list(self.history), "tools": [tool]}

    def answer(self, final: dict[str, Any]) -> None:
        message = final["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        assistant: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if calls:
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                }
                for c in calls
            ]
        self.history.append(assistant)
        self.history += [
            {"role": "tool", "tool_call_id": c["id"], "content": f"output of {c['function']['name']}"}
            for c in calls
        ]

    def call_sync(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return self.client.chat.completions.create(**params).model_dump(), 0
        with self.client.chat.completions.stream(**params) as events:
            count = sum(1 for _ in events)
            return events.get_final_completion().model_dump(), count

    async def call_async(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return (await self.client.chat.completions.create(**params)).model_dump(), 0
        async with self.client.chat.completions.stream(**params) as events:
            count = 0
            async for _ in events:
                count += 1
            return (await events.get_final_completion()).model_dump(), count


class ResponsesAgent(Agent):
    """OpenAI Responses: ``responses.create`` / ``responses.stream``, output items fed back as input."""

    def start(self, task: str) -> None:
        self.history = [{"role": "user", "content": task}]

    def params(self) -> dict[str, Any]:
        tool = {"type": "function", "name": "bash", "parameters": TOOL_PARAMETERS, "strict": False}
        return {"model": AGENT_MODEL, "instructions": SYSTEM, "input": list(self.history), "tools": [tool]}

    def answer(self, final: dict[str, Any]) -> None:
        for item in final["output"]:
            self.history.append({key: value for key, value in item.items() if value is not None})
        self.history += [
            {
                "type": "function_call_output",
                "call_id": item["call_id"],
                "output": f"output of {item['name']}",
            }
            for item in final["output"]
            if item["type"] == "function_call"
        ]

    def call_sync(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return self.client.responses.create(**params).model_dump(), 0
        with self.client.responses.stream(**params) as events:
            count = sum(1 for _ in events)
            return events.get_final_response().model_dump(), count

    async def call_async(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return (await self.client.responses.create(**params)).model_dump(), 0
        async with self.client.responses.stream(**params) as events:
            count = 0
            async for _ in events:
                count += 1
            return (await events.get_final_response()).model_dump(), count


class MessagesAgent(Agent):
    """Anthropic Messages: ``messages.create`` / ``messages.stream``, tool results as user blocks."""

    def make_client(self, base_url: str | None, token: str, use_async: bool, max_retries: int) -> Any:
        import anthropic  # on use: ~3 s of imports that the fast tier's users of this module skip

        kind = anthropic.AsyncAnthropic if use_async else anthropic.Anthropic
        root = base_url.removesuffix("/v1") if base_url else None
        return kind(base_url=root, api_key=token, max_retries=max_retries, timeout=30)

    def start(self, task: str) -> None:
        self.history = [{"role": "user", "content": task}]

    def params(self) -> dict[str, Any]:
        tool = {"name": "bash", "input_schema": TOOL_PARAMETERS}
        return {
            "model": AGENT_MODEL,
            "max_tokens": 1024,
            "system": SYSTEM,
            "messages": list(self.history),
            "tools": [tool],
        }

    def answer(self, final: dict[str, Any]) -> None:
        content = [{k: v for k, v in block.items() if v is not None} for block in final["content"]]
        self.history.append({"role": "assistant", "content": content})
        results = [
            {"type": "tool_result", "tool_use_id": block["id"], "content": f"output of {block['name']}"}
            for block in content
            if block["type"] == "tool_use"
        ]
        if results:
            self.history.append({"role": "user", "content": results})

    def call_sync(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return self.client.messages.create(**params).model_dump(), 0
        with self.client.messages.stream(**params) as events:
            count = sum(1 for _ in events)
            return events.get_final_message().model_dump(), count

    async def call_async(self, params: dict[str, Any], stream: bool) -> tuple[dict[str, Any], int]:
        if not stream:
            return (await self.client.messages.create(**params)).model_dump(), 0
        async with self.client.messages.stream(**params) as events:
            count = 0
            async for _ in events:
                count += 1
            return (await events.get_final_message()).model_dump(), count


AGENTS: dict[str, type[Agent]] = {
    "openai-chat": ChatAgent,
    "openai-responses": ResponsesAgent,
    "anthropic-messages": MessagesAgent,
}
