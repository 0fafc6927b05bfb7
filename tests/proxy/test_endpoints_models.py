"""The proxy's count_tokens and models endpoints (`reroll_proxy.endpoints_models`), in process:
the live upstream is the bundled scripted model's app, served on loopback."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from reroll_contracts.proxy import ClientLimits, UpstreamConfig, VolatileRule
from reroll_contracts.trajectory import Exchange
from reroll_proxy.endpoints_models import ModelEndpoints
from reroll_proxy.front import Handler, Router, Server
from reroll_proxy.messages import Request, StreamResponse
from reroll_proxy.scripted import ModelScript, build_app
from reroll_proxy.scripted_answers import count_prompt_tokens
from reroll_proxy.upstream import Http1Upstream
from reroll_proxy.volatile import Volatility

PROMPT: dict[str, Any] = {
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Fix the test."}]},
        {"role": "system", "content": "cwd: /tmp/abc/app, Today's date is 2026-11-23."},
    ],
    "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
}
USAGE = {
    "input_tokens": 120,
    "cache_read_input_tokens": 300,
    "cache_creation_input_tokens": 5,
    "output_tokens": 9,
}


def recorded(path: str = "/v1/messages?beta=true", model: str = "claude-recorded") -> Exchange:
    body = {**PROMPT, "model": "m", "max_tokens": 100, "stream": True, "metadata": {"user_id": "u1"}}
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": USAGE}
    return Exchange.model_validate(
        {
            "request": {"timestamp": "t", "path": path, "body": body},
            "response": {"timestamp": "t", "status_code": 200, "body": answer},
            "metadata": {"step": 0, "model": model},
        }
    )


@contextlib.asynccontextmanager
async def client_for(endpoints: ModelEndpoints) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of `endpoints` served alone by the proxy's server (`reroll_proxy.front`)."""
    routes: Router[Handler] = Router()
    endpoints.add_routes(routes)

    async def dispatch(request: Request) -> StreamResponse:
        _, handler = routes.resolve(request)
        assert handler is not None, request.path
        return await handler(request)

    server = Server(dispatch, ClientLimits())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = await server.listen(sock)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{sock.getsockname()[1]}") as client:
            yield client
    finally:
        site.close()
        await server.shutdown()


@pytest.fixture
async def replay_only() -> AsyncIterator[aiohttp.ClientSession]:
    rules = [VolatileRule(pattern=r"/tmp/\w+/app", label="workspace")]
    async with client_for(ModelEndpoints(None, [recorded()], Volatility(rules), lambda: None)) as client:
        yield client


async def test_count_tokens_in_replay_only_is_the_recorded_prompt_count(
    replay_only: aiohttp.ClientSession,
) -> None:
    body = {**PROMPT, "model": "other"}
    body["messages"] = [
        PROMPT["messages"][0],
        {"role": "system", "content": "cwd: /tmp/xyz/app, Today's date is 2026-11-23."},
    ]
    response = await replay_only.post("/v1/messages/count_tokens?beta=true", json=body)
    assert response.status == 200
    assert await response.json() == {"input_tokens": 120 + 300 + 5}  # every prompt token, cached or not


async def test_count_tokens_of_an_unrecorded_prompt_is_a_clear_501(
    replay_only: aiohttp.ClientSession,
) -> None:
    body = {**PROMPT, "messages": [{"role": "user", "content": "Something else."}]}
    response = await replay_only.post("/messages/count_tokens", json=body)
    assert response.status == 501
    error = (await response.json())["error"]
    assert error["type"] == "count_tokens_unavailable" and "never guesses" in error["message"]
    bad = await replay_only.post("/v1/messages/count_tokens", json={"model": "m"})
    assert bad.status == 400


async def test_count_tokens_goes_to_a_live_anthropic_upstream() -> None:
    script = ModelScript.model_validate({"turns": [{"content": "hi"}]})
    upstream = TestServer(build_app(script, "anthropic-messages"))
    await upstream.start_server()
    config = UpstreamConfig(
        base_url=str(upstream.make_url("/v1")), model="scripted", api_format="anthropic-messages"
    )
    live = Http1Upstream(timeout_seconds=10)
    try:
        async with client_for(ModelEndpoints(config, [], Volatility(), lambda: live)) as client:
            response = await client.post("/v1/messages/count_tokens", json={**PROMPT, "model": "x"})
            assert response.status == 200
            assert await response.json() == {"input_tokens": count_prompt_tokens(PROMPT)}
    finally:
        await live.aclose()
        await upstream.close()


async def test_models_lists_the_served_models_in_the_callers_shape() -> None:
    upstream = UpstreamConfig(base_url="http://127.0.0.1:9/v1", model="live-model")
    async with client_for(ModelEndpoints(upstream, [recorded()], Volatility(), lambda: None)) as client:
        anthropic = await (await client.get("/v1/models", headers={"anthropic-version": "2023-06-01"})).json()
        assert [item["id"] for item in anthropic["data"]] == ["live-model", "claude-recorded"]
        assert anthropic["data"][0]["type"] == "model" and anthropic["has_more"] is False
        openai = await (await client.get("/models")).json()
        assert openai["object"] == "list" and openai["data"][1] == {
            "id": "claude-recorded", "object": "model", "created": 0, "owned_by": "reroll",
        }  # fmt: skip
        one = await client.get("/v1/models/live-model", headers={"anthropic-version": "2023-06-01"})
        assert (await one.json())["id"] == "live-model"
        missing = await client.get("/v1/models/gpt-9")
        assert missing.status == 404 and "gpt-9" in (await missing.json())["error"]["message"]
