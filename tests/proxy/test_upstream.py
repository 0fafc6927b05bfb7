"""The `Upstream` seam (`reroll_proxy.upstream`): the proxy in process, its upstream the in-memory
twin (no model server, no socket to a provider), and the HTTP upstream's errors converted."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from typing import Any

import orjson
import pytest
from reroll_contracts.errors import UpstreamError
from reroll_contracts.wire import format_named
from reroll_contracts.wire.sse import encode_event
from reroll_proxy.server import RunningProxy
from reroll_proxy.upstream import CannedResponse, Http1Upstream, InMemoryUpstream, UpstreamRequest

from tests.proxy.conftest import IN_MEMORY_KEY, TOKEN, StartInMemory, http_json, lines

CHAT = format_named("openai-chat")
ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "upstream-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
REQUEST = {"model": "agent-model", "messages": [{"role": "user", "content": "hi"}]}


async def post(
    proxy: RunningProxy, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """POST `body` to the proxy's chat endpoint from a thread (the proxy serves on this loop)."""
    auth = {"Authorization": f"Bearer {TOKEN}"} if headers is None else headers
    return await asyncio.to_thread(http_json, "POST", proxy.base_url + "/chat/completions", body, auth)


async def test_in_memory_upstream_answers_in_order_and_keeps_each_request() -> None:
    upstream = InMemoryUpstream([CannedResponse(201, b"first"), UpstreamError("down")])
    request = UpstreamRequest("http://x/v1/chat/completions", {"a": "b"}, b"{}")
    async with await upstream.send(request) as response:
        assert (response.status, await response.read()) == (201, b"first")
    with pytest.raises(UpstreamError, match="down"):
        await upstream.send(request)
    async with await upstream.send(request) as response:
        assert response.status == 500 and b"exhausted" in await response.read()
    assert upstream.requests == [request] * 3
    await upstream.aclose()
    assert upstream.closed


async def test_a_live_request_goes_to_the_upstream_with_the_model_swapped_and_the_key(
    in_memory_proxy: StartInMemory,
) -> None:
    proxy, upstream = await in_memory_proxy(CannedResponse(body=orjson.dumps(ANSWER)))
    code, headers, body = await post(proxy, REQUEST)
    assert code == 200 and body == ANSWER and headers["x-reroll-source"] == "live"
    (sent,) = upstream.requests
    assert sent.url == "http://provider.invalid/v1/chat/completions"
    assert sent.headers["Authorization"] == f"Bearer {IN_MEMORY_KEY}"
    assert orjson.loads(sent.body) == {**REQUEST, "model": "swapped"}
    (line,) = lines(proxy)
    assert line["metadata"]["source"] == "live" and line["metadata"]["model"] == "upstream-model"
    assert line["response"]["body"] == ANSWER and IN_MEMORY_KEY not in json.dumps(line)


async def test_a_streamed_answer_is_forwarded_and_recorded_event_by_event(
    in_memory_proxy: StartInMemory,
) -> None:
    events = CHAT.to_events(ANSWER, {**REQUEST, "stream": True})
    chunks = [encode_event(event) for event in events]
    canned = CannedResponse(content_type="text/event-stream", chunks=chunks)
    proxy, _ = await in_memory_proxy(canned)
    text = await asyncio.to_thread(_stream, proxy, {**REQUEST, "stream": True})
    assert text == b"".join(chunks)
    (line,) = lines(proxy)
    assert [event["data"] for event in line["response"]["events"]] == [event.data for event in events]
    assert line["response"]["body"]["choices"][0]["message"]["content"] == "Hello there."


async def test_a_stream_that_breaks_off_records_the_error(in_memory_proxy: StartInMemory) -> None:
    events = CHAT.to_events(ANSWER, {**REQUEST, "stream": True})
    canned = CannedResponse(
        content_type="text/event-stream", chunks=[encode_event(event) for event in events], broken_after=1
    )
    proxy, _ = await in_memory_proxy(canned)
    await asyncio.to_thread(_stream, proxy, {**REQUEST, "stream": True})
    (line,) = lines(proxy)
    assert line["metadata"]["error"] == "upstream stream broke off: the in-memory stream broke off"
    assert len(line["response"]["events"]) == 1


async def test_an_unreachable_upstream_is_502_and_recorded(in_memory_proxy: StartInMemory) -> None:
    proxy, _ = await in_memory_proxy(UpstreamError("ConnectionRefusedError()"))
    code, _, body = await post(proxy, REQUEST)
    assert code == 502 and "unreachable: ConnectionRefusedError()" in body["error"]["message"]
    (line,) = lines(proxy)
    assert line["response"]["status_code"] == 502 and "unreachable" in line["metadata"]["error"]


@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_unauthorized(in_memory_proxy: StartInMemory, token: str | None) -> None:
    """Moved from test_proxy.py: the upstream only has to exist, so it is the in-memory twin."""
    proxy, upstream = await in_memory_proxy()
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    code, _, body = await post(proxy, {"model": "m", "messages": []}, headers)
    assert code == 401 and body["error"]["code"] == "invalid_api_key"
    assert lines(proxy) == [] and upstream.requests == []
    root = proxy.base_url.removesuffix("/v1")
    assert (await asyncio.to_thread(http_json, "GET", root + "/_reroll/status"))[0] == 401
    code, _, body = await asyncio.to_thread(http_json, "GET", root + "/healthz")
    assert (code, body) == (200, {"ok": True})


async def test_x_api_key_header_is_accepted(in_memory_proxy: StartInMemory) -> None:
    """Moved from test_proxy.py (the in-memory twin answers instead of the scripted model)."""
    proxy, _ = await in_memory_proxy(CannedResponse(body=orjson.dumps(ANSWER)))
    code, headers, _ = await post(proxy, REQUEST, {"x-api-key": TOKEN})
    assert code == 200 and headers["x-reroll-source"] == "live"
    assert "x-api-key" not in lines(proxy)[0]["request"]["headers"]


async def test_the_http1_upstream_converts_a_refused_connection() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    upstream = Http1Upstream(timeout_seconds=5)
    try:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await upstream.send(UpstreamRequest(f"http://127.0.0.1:{port}/v1/chat/completions", {}, b"{}"))
    finally:
        await upstream.aclose()


def _stream(proxy: RunningProxy, body: dict[str, Any]) -> bytes:
    """The raw bytes of a streamed answer (a plain HTTP client, in a thread)."""
    request = urllib.request.Request(
        proxy.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return bytes(response.read())
