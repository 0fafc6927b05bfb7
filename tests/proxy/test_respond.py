"""Streams to the agent (in process): how `EventSource` batches and paces recorded events (no
clock), and how a live stream is forwarded: the upstream's bytes as they are, its terminal event
held back until the exchange is recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from reroll_contracts.trajectory import Exchange, ExchangeRequest, SseEvent
from reroll_contracts.wire import format_named
from reroll_contracts.wire.sse import encode_event
from reroll_proxy.respond import EventSource
from reroll_proxy.server import RunningProxy
from reroll_proxy.upstream import CannedResponse, UpstreamRequest, UpstreamResponse

from tests.proxy.conftest import TOKEN, StartInMemory, lines

EVENTS = [SseEvent(data=str(i)) for i in range(3)]
OFFSETS_MS = [0.0, 200.0, 600.0]


async def served(source: EventSource, monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[str]], list[float]]:
    """The batches `source` yields (their events' data) and the pauses it asked for, in seconds."""
    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    batches = [[event.data for event in batch] async for batch in source.batches()]
    return batches, pauses


async def test_timing_factor_zero_sends_every_event_in_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS, timing_factor=0.0), monkeypatch)
    assert batches == [["0", "1", "2"]] and pauses == []


async def test_a_timing_factor_paces_each_event_by_the_recorded_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS, timing_factor=0.5), monkeypatch)
    assert batches == [["0"], ["1"], ["2"]]
    assert pauses == pytest.approx([0.1, 0.2])  # (200 - 0) x 0.5 ms, then (600 - 200) x 0.5 ms


async def test_offsets_of_another_length_send_without_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    batches, pauses = await served(EventSource(EVENTS, OFFSETS_MS[:2], timing_factor=1.0), monkeypatch)
    assert batches == [["0", "1", "2"]] and pauses == []


CHAT = format_named("openai-chat")
ANSWER: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "upstream-model",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Héllo thère."}, "finish_reason": "stop"}
    ],
}
STREAMED = {"model": "agent-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_a_live_answer_is_recorded_with_its_request_serialised_once_ahead(
    in_memory_proxy: StartInMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request part of a live exchange's line is made while the upstream answers (once,
    `ServedStep.work_ahead`), and the line is the exchange's own (`Exchange.to_line`)."""
    made: list[str] = []
    line_json = ExchangeRequest.line_json

    def counted(request: ExchangeRequest) -> bytes:
        made.append("request")
        return line_json(request)

    monkeypatch.setattr(ExchangeRequest, "line_json", counted)
    proxy, upstream = await in_memory_proxy(CannedResponse(body=orjson.dumps(ANSWER)))
    real_send = upstream.send

    async def send(request: UpstreamRequest) -> UpstreamResponse:
        await asyncio.sleep(0)  # the upstream answers after a turn of the loop, as a real one does
        made.append("answer")
        return await real_send(request)

    monkeypatch.setattr(upstream, "send", send)
    body = {"model": "agent-model", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response,
    ):
        assert await response.json() == ANSWER
    assert made == ["request", "answer"]
    written = proxy.rollout.config.trajectory_path.read_bytes()
    assert written == Exchange.model_validate_json(written).to_line()


async def streamed_proxy(in_memory_proxy: StartInMemory, chunks: list[bytes]) -> RunningProxy:
    proxy, _ = await in_memory_proxy(CannedResponse(content_type="text/event-stream", chunks=chunks))
    return proxy


async def read_stream(proxy: RunningProxy) -> bytes:
    """The body of a streamed chat request, as the agent receives it."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + "/chat/completions", json=STREAMED, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response,
    ):
        assert response.status == 200
        return await response.read()


async def test_a_live_stream_reaches_the_agent_byte_for_byte(in_memory_proxy: StartInMemory) -> None:
    """Comments, ``id:`` fields and chunks cut inside a line or a UTF-8 character are passed on as
    the upstream sent them (re-encoding the parsed events would drop the first two); the held
    terminal event is sent as its event."""
    events = CHAT.to_events(ANSWER, STREAMED, piece_chars=4)
    numbered = b"".join(b"id: %d\n" % n + encode_event(e) for n, e in enumerate(events[:-1]))
    body = b": keep-alive\n\n" + numbered + encode_event(events[-1])  # the held end: sent as its event
    accented = body.index("è".encode()) + 1  # the second byte of a two-byte character
    chunks = [body[:9], body[9:accented], body[accented:-40], body[-40:-7], body[-7:]]
    proxy = await streamed_proxy(in_memory_proxy, chunks)
    assert await read_stream(proxy) == body
    (line,) = lines(proxy)
    assert [event["data"] for event in line["response"]["events"]] == [event.data for event in events]
    assert line["response"]["body"]["choices"][0]["message"]["content"] == "Héllo thère."


async def held_until_recorded(proxy: RunningProxy, body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the exchange is being recorded, the agent has received `body` up to its ``data:
    [DONE]`` (byte for byte) and nothing more, and no line is written; the rest once it is."""
    end = body.index(b"data: [DONE]")
    recording, release = asyncio.Event(), asyncio.Event()
    record = proxy.rollout.recorder.record

    async def held(step: int, exchange: Exchange, *, request_json: bytes | None = None) -> None:
        recording.set()
        await release.wait()
        await record(step, exchange, request_json=request_json)

    monkeypatch.setattr(proxy.rollout.recorder, "record", held)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + "/chat/completions", json=STREAMED, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as response,
    ):
        await recording.wait()
        received = b""
        while len(received) < end:  # what was written before the record reaches the agent
            received += await asyncio.wait_for(response.content.readany(), 5)
        await asyncio.sleep(0.1)  # anything written beyond it would arrive now
        received += response.content.read_nowait()
        assert received == body[:end] and lines(proxy) == []
        release.set()
        assert received + await response.read() == body
    assert lines(proxy)[0]["response"]["events"][-1]["data"] == "[DONE]"


@pytest.mark.parametrize("cut", [0, 3, 8], ids=["before", "inside-marker", "after-marker"])
async def test_the_terminal_event_waits_for_the_record_however_the_chunks_cut_it(
    in_memory_proxy: StartInMemory, monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    """`cut` bytes into ``[DONE]``, the chunk ends: the agent gets every event but the last
    while the exchange is being recorded, and the last once it is."""
    body = b"".join(map(encode_event, CHAT.to_events(ANSWER, STREAMED, piece_chars=4)))
    end = body.index(b"data: [DONE]")
    proxy = await streamed_proxy(in_memory_proxy, [body[: end + 6 + cut], body[end + 6 + cut :]])
    await held_until_recorded(proxy, body, monkeypatch)


async def test_a_stream_in_one_piece_is_forwarded_as_it_is_up_to_its_terminal_event(
    in_memory_proxy: StartInMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole stream in one chunk, its events spelt ``data:{...}`` (no space: re-encoding
    would add one): every event before ``[DONE]`` reaches the agent as the upstream's bytes while
    the exchange is recorded, ``[DONE]`` once it is."""
    events = CHAT.to_events(ANSWER, STREAMED, piece_chars=4)
    body = b"".join(encode_event(event).replace(b"data: ", b"data:") for event in events[:-1])
    body += encode_event(events[-1])
    proxy = await streamed_proxy(in_memory_proxy, [body])
    await held_until_recorded(proxy, body, monkeypatch)


async def test_a_stream_with_cr_line_ends_is_sent_as_its_events(in_memory_proxy: StartInMemory) -> None:
    """``\\r\\n`` line ends: the events are re-encoded (``\\n``), from the chunk with the first on."""
    events = CHAT.to_events(ANSWER, STREAMED, piece_chars=4)
    plain = b"".join(map(encode_event, events[:2]))
    crlf = b"".join(map(encode_event, events[2:])).replace(b"\n", b"\r\n")
    proxy = await streamed_proxy(in_memory_proxy, [plain, crlf[:11], crlf[11:]])
    assert await read_stream(proxy) == b"".join(map(encode_event, events))
    (line,) = lines(proxy)
    assert [event["data"] for event in line["response"]["events"]] == [event.data for event in events]
