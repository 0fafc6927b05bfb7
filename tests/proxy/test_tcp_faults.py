"""TCP faults through a real Toxiproxy-compatible server (tools/toxiproxy-server, over noxious),
driven with the ``toxiproxy-python`` client: between the openai SDK and the proxy ("agent" side)
and between the proxy and the scripted model ("upstream" side).

For each fault the agent loop runs the whole script; the fault is switched on at turn 2 and, when
it breaks the turn, switched off before the agent's one retry. Then: the recording loads, every
turn the agent received is in it (in order), and a replay of the recording serves it all back.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from reroll.cache import cache_dir
from reroll.host.tcpfaults import Front, ToxiproxyServer, find_server
from reroll_contracts.errors import InfrastructureError
from reroll_contracts.trajectory import load_trajectory
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.proxy.conftest import TOKEN, TURNS, Service, StartProxy, Turn, ask, converse

pytestmark = pytest.mark.spawns  # every test runs the Toxiproxy-compatible server and the proxy

FAULTS: dict[str, dict[str, int]] = {
    "latency": {"latency": 150, "jitter": 0},
    "bandwidth": {"rate": 2},
    "slicer": {"average_size": 16, "size_variation": 8, "delay": 2000},
    "timeout": {"timeout": 300},
    "reset_peer": {"timeout": 0},
    "limit_data": {"bytes": 300},
}
"""Toxic type -> attributes (milliseconds, KB/s, bytes, microseconds for slicer's delay)."""
BREAKING = {"timeout", "reset_peer", "limit_data"}
"""Faults that end the connection, so the turn fails and the agent retries."""
LATENCY_SECONDS = FAULTS["latency"]["latency"] / 1000
names = count()


@pytest.fixture(scope="module")
def toxiproxy() -> Iterator[ToxiproxyServer]:
    """The Toxiproxy server on loopback; the module skips when none is installed."""
    if find_server() is None:
        pytest.skip(
            f"no Toxiproxy server in {cache_dir() / 'bin'} or on PATH: scripts/install-toxiproxy "
            f"builds one with cargo (log: {cache_dir() / 'install-toxiproxy.log'})"
        )
    try:
        server = ToxiproxyServer.start()
    except InfrastructureError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@dataclass
class FaultyAgent:
    """Asks one turn at a time; switches `fault` on at turn 2 and off again after it broke a turn."""

    front: Front
    fault: str
    failures: list[BaseException] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    turn: int = 0

    def __call__(self, client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool) -> Turn:
        if self.turn == 1:
            self.front.proxy.add_toxic(type=self.fault, name="fault", attributes=FAULTS[self.fault])
        self.turn += 1
        started = time.monotonic()
        try:
            return ask(client, messages, stream=stream)
        except (openai.APIError, httpx.HTTPError) as exc:
            self.failures.append(exc)
            self.front.proxy.destroy_toxic("fault")
            return ask(client, messages, stream=stream)
        finally:
            self.seconds.append(time.monotonic() - started)


def recorded_turn(line: dict[str, Any]) -> Turn | None:
    """The turn an exchange line holds (None for an error exchange)."""
    if line["response"]["status_code"] != 200:
        return None
    choices = line["response"]["body"].get("choices") or [{"message": {}}]  # none: a stream cut early
    message = choices[0]["message"]
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])
    ]
    return Turn(message.get("content"), calls)


def same(a: Turn, b: Turn | None) -> bool:
    return b is not None and (a.content, a.tool_calls) == (b.content, b.tool_calls)


@pytest.mark.parametrize("side", ["agent", "upstream"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_keeps_the_recording_whole_and_replayable(
    toxiproxy: ToxiproxyServer, start_proxy: StartProxy, scripted_model: Service, fault: str, side: str
) -> None:
    upstream = toxiproxy.front(f"upstream-{next(names)}", scripted_model.base_url)
    proxy = start_proxy(upstream_url=upstream.base_url)
    agent_side = toxiproxy.front(f"agent-{next(names)}", proxy.base_url)
    agent = FaultyAgent(agent_side if side == "agent" else upstream, fault)
    with openai.OpenAI(base_url=agent_side.base_url, api_key=TOKEN, max_retries=0, timeout=10) as client:
        received, _ = converse(client, TURNS, stream=True, ask_turn=agent)
    for front in (agent_side, upstream):
        front.proxy.destroy()

    loaded = load_trajectory(proxy.trajectory_path)
    assert loaded.truncated_line is None
    lines = [exchange.model_dump(mode="json") for exchange in loaded.exchanges]
    recorded = iter(recorded_turn(line) for line in lines)
    assert all(any(same(turn, line) for line in recorded) for turn in received), "a received turn is missing"
    if fault in BREAKING:
        assert len(agent.failures) == 1, "the fault did not break the turn it was applied to"
    else:
        assert agent.failures == [] and len(lines) == TURNS
        assert agent.seconds[1] >= {"latency": LATENCY_SECONDS, "bandwidth": 0.5}.get(fault, 0.0)

    replay = start_proxy(replay_path=proxy.trajectory_path)
    with openai.OpenAI(base_url=replay.base_url, api_key=TOKEN, max_retries=0, timeout=10) as client:
        for line in lines:
            body = line["request"]["body"]
            expected = recorded_turn(line)
            if expected is None:
                with pytest.raises(openai.APIStatusError) as error:
                    ask(client, body["messages"], stream=body.get("stream", False))
                assert error.value.status_code == line["response"]["status_code"]
            else:
                assert same(ask(client, body["messages"], stream=body.get("stream", False)), expected)
    status = replay.status()
    assert (status.served_replayed, status.served_live, status.divergences) == (len(lines), 0, [])


def test_toxiproxy_rest_api(toxiproxy: ToxiproxyServer, scripted_model: Service) -> None:
    """The REST subset toxiproxy-python uses, with Toxiproxy's JSON shapes and status codes."""
    client = toxiproxy.client
    assert client.running() and client.version()
    front = toxiproxy.front("api", scripted_model.base_url)
    assert front.base_url.endswith("/v1") and front.base_url != scripted_model.base_url
    with pytest.raises(ProxyExists):
        client.create(upstream=front.proxy.upstream, name="api")
    front.proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 10})
    front.proxy.add_toxic(type="reset_peer", attributes={"timeout": 5})
    toxics = front.proxy.toxics()
    assert {name: (t.type, t.stream, t.attributes) for name, t in toxics.items()} == {
        "latency_upstream": ("latency", "upstream", {"latency": 10, "jitter": 0}),
        "reset_peer_downstream": ("reset_peer", "downstream", {"timeout": 5}),
    }
    with pytest.raises(ProxyExists):
        front.proxy.add_toxic(type="latency", stream="upstream", attributes={"latency": 10})
    with pytest.raises(InvalidToxic, match="unknown variant"):
        front.proxy.add_toxic(type="no_such_toxic", name="x")
    with pytest.raises(NotFound):
        front.proxy.destroy_toxic("x")
    assert client.reset() and front.proxy.toxics() == {}
    front.proxy.disable()
    assert client.get_proxy("api").enabled is False
    with pytest.raises(httpx.ConnectError), httpx.Client(timeout=5) as http:
        http.get(front.base_url + "/models")
    front.proxy.enable()
    with httpx.Client(timeout=5) as http:
        assert http.get(front.base_url + "/models").status_code < 500
    front.proxy.destroy()
    assert client.get_proxy("api") is None


@pytest.mark.spawns
def test_a_server_that_does_not_start_is_reported(tmp_path: Path) -> None:
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'cannot bind: address in use'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(InfrastructureError, match=r"did not start: 'cannot bind: address in use\\n'"):
        ToxiproxyServer.start(fake, ready_timeout_seconds=5)


def test_front_needs_a_host_and_port(toxiproxy: ToxiproxyServer) -> None:
    with pytest.raises(ValueError, match=re.escape("needs a host and a port: 'http://127.0.0.1/v1'")):
        toxiproxy.front("bad", "http://127.0.0.1/v1")
