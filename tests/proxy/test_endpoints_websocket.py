"""Responses over WebSocket: the proxy refuses the upgrade at once (426), so a WebSocket-first
client falls back to HTTP after one attempt."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from reroll_proxy.endpoints_websocket import REFUSAL_STATUS

from tests.proxy.conftest import AGENT_MODEL, TOKEN, Service, StartInMemory, StartProxy, lines


async def websocket_first(base_url: str, attempts_allowed: int) -> list[str]:
    """What a WebSocket-first Responses client (Codex's built-in provider) does: try the upgrade,
    retry any failure but 426, fall back to HTTP after a 426; the attempts made, in order."""
    attempts: list[str] = []
    url = base_url.replace("http://", "ws://") + "/responses"
    async with aiohttp.ClientSession() as session:
        for _ in range(attempts_allowed):
            attempts.append("websocket")
            try:
                async with session.ws_connect(url, headers={"Authorization": f"Bearer {TOKEN}"}):
                    return attempts
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == REFUSAL_STATUS:
                    break
    attempts.append("http")
    return attempts


@pytest.mark.spawns  # the real proxy and scripted model as subprocesses
def test_a_websocket_first_client_is_refused_once_and_served_over_http(
    start_proxy: StartProxy, scripted_model: Service
) -> None:
    proxy = start_proxy(upstream_url=scripted_model.base_url)
    attempts = asyncio.run(websocket_first(proxy.base_url, attempts_allowed=7))
    assert attempts == ["websocket", "http"]
    client = proxy.client()
    with client.responses.create(model=AGENT_MODEL, input="hello", stream=True) as events:
        kinds = [event.type for event in events]
    assert kinds[-1] == "response.completed"
    assert proxy.status().websocket_upgrades_refused == 1
    (line,) = proxy.lines()  # the refusal is no exchange
    assert line["request"]["path"] == "/v1/responses" and line["metadata"]["step"] == 0


async def test_the_refusal_needs_the_token_and_has_the_responses_error_shape(
    in_memory_proxy: StartInMemory,
) -> None:
    """The upstream only has to exist: the in-memory twin, the proxy in process."""
    proxy, upstream = await in_memory_proxy()

    async def upgrade(token: str) -> tuple[int, dict[str, object]]:
        headers = {"Authorization": f"Bearer {token}", "Upgrade": "websocket", "Connection": "Upgrade"}
        async with (
            aiohttp.ClientSession() as session,
            session.get(proxy.base_url + "/responses", headers=headers) as response,
        ):
            return response.status, await response.json()

    status, body = await upgrade(TOKEN)
    assert status == REFUSAL_STATUS and "HTTP only" in str(body["error"])
    assert (await upgrade("wrong"))[0] == 401
    assert proxy.rollout.websockets.count == 1 and lines(proxy) == [] and upstream.requests == []
