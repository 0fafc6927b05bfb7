"""A tool-calling agent loop on litellm, run as a subprocess by the tests (litellm keeps global
state and background workers, so it stays out of the pytest process).

``python tests/proxy/litellm_client.py FORMAT BASE_URL TOKEN TURNS`` runs the loop twice, not
streamed then streamed (one litellm start-up for both), and prints one JSON line per turn:
``{"content", "tool_calls": [[name, arguments], ...]}``. FORMAT ``openai-chat`` and
``anthropic-messages`` use ``litellm.completion`` (model ``openai/...`` / ``anthropic/...``),
``openai-responses`` uses ``litellm.responses``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

RESPONSES_MODEL = "openai/gpt-4o-mini"
"""A model litellm knows: for unknown ones it fakes Responses streaming (one non-streamed call)."""
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def completion_turn(
    model: str, base_url: str, token: str, messages: list[Any], stream: bool
) -> dict[str, Any]:
    params: dict[str, Any] = {"model": model, "api_base": base_url, "api_key": token, "tools": TOOLS}
    if model.startswith("anthropic/"):
        params["max_tokens"] = 1024
    if stream:
        chunks = list(litellm.completion(messages=messages, stream=True, **params))
        response: Any = litellm.stream_chunk_builder(chunks, messages=messages)
    else:
        response = litellm.completion(messages=messages, **params)
    message = response.choices[0].message
    calls = [[c.function.name, c.function.arguments, c.id] for c in message.tool_calls or []]
    return {"content": message.content or "", "tool_calls": calls}


def chat_loop(model: str, base_url: str, token: str, turns: int, stream: bool) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a test agent."},
        {"role": "user", "content": "List the files."},
    ]
    for _ in range(turns):
        turn = completion_turn(model, base_url, token, messages, stream)
        print(
            json.dumps({"content": turn["content"], "tool_calls": [c[:2] for c in turn["tool_calls"]]}),
            flush=True,
        )
        assistant: dict[str, Any] = {"role": "assistant", "content": turn["content"]}
        if turn["tool_calls"]:
            assistant["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for n, a, i in turn["tool_calls"]
            ]
        messages.append(assistant)
        messages += [
            {"role": "tool", "tool_call_id": i, "content": f"output of {n}"} for n, _, i in turn["tool_calls"]
        ]


def responses_loop(base_url: str, token: str, turns: int, stream: bool) -> None:
    items: list[Any] = [{"role": "user", "content": "List the files."}]
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    for _ in range(turns):
        params: dict[str, Any] = {
            "model": RESPONSES_MODEL,
            "api_base": base_url,
            "api_key": token,
            "tools": tools,
        }
        if stream:
            final: Any = None
            for event in litellm.responses(input=list(items), stream=True, **params):
                if getattr(event, "type", None) == "response.completed":
                    final = event.response
        else:
            final = litellm.responses(input=list(items), **params)
        output = [
            item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else dict(item)
            for item in final.output
        ]
        content = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
        calls = [i for i in output if i["type"] == "function_call"]
        print(
            json.dumps({"content": content, "tool_calls": [[c["name"], c["arguments"]] for c in calls]}),
            flush=True,
        )
        items += output
        items += [
            {"type": "function_call_output", "call_id": c["call_id"], "output": f"output of {c['name']}"}
            for c in calls
        ]


def main() -> None:
    api_format, base_url, token, turns = sys.argv[1:5]
    for streamed in (False, True):
        if api_format == "openai-responses":
            responses_loop(base_url, token, int(turns), streamed)
        elif api_format == "anthropic-messages":
            chat_loop("anthropic/claude-test", base_url.removesuffix("/v1"), token, int(turns), streamed)
        else:
            chat_loop("openai/gpt-test", base_url, token, int(turns), streamed)


if __name__ == "__main__":
    main()
