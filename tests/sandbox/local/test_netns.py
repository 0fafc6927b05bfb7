"""`reroll.sandbox.local.netns` in-process: which host ports belong to a sandbox, and the install-time
CONNECT proxy (served here on the host's loopback; tests/sandbox/test_isolated.py runs both in a
real network namespace)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path

from reroll.sandbox.allowlist import EVERYWHERE, Resolved
from reroll.sandbox.local import netns

PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: C911537F:A3E1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2
   2: C911537F:0050 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3
   3: 00000000:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4
   4: C911537F:0051 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5
"""


def test_only_listeners_on_exactly_the_sandboxs_address_are_its(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(PROC_NET_TCP)
    # 127.0.0.1:8080, 0.0.0.0:8081 and an established connection are not the sandbox's
    assert netns.listening_ports("127.83.17.201", table) == [81, 41953]
    assert netns.listening_ports("127.0.0.1", table) == [8080]


def test_private_loopback_is_in_127_slash_8_and_not_the_usual_addresses() -> None:
    for _ in range(200):
        address = netns.private_loopback()
        first, second, _, last = (int(part) for part in address.split("."))
        assert first == 127 and second >= 3 and 1 <= last <= 254


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read(200)
    writer.close()
    return answer


async def test_the_install_proxy_tunnels_connect_and_refuses_anything_else() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo:" + await reader.read(4))
        await writer.drain()
        writer.close()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await asyncio.start_server(netns._connect_handler(netns._anywhere), "127.0.0.1", 0)
    target_port = target.sockets[0].getsockname()[1]
    proxy_port = proxy.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"CONNECT 127.0.0.1:{target_port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"ping")
        assert await reader.read(16) == b"echo:ping"
        writer.close()
        get = await _ask(proxy_port, b"GET http://example.invalid/ HTTP/1.1\r\n\r\n")
        assert get.startswith(b"HTTP/1.1 405 ")
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            closed_port = unused.getsockname()[1]
        refused = await _ask(proxy_port, f"CONNECT 127.0.0.1:{closed_port} HTTP/1.1\r\n\r\n".encode())
        assert refused.startswith(b"HTTP/1.1 502 ")
    finally:
        for server in (target, proxy):
            server.close()


def test_an_allow_list_proxy_tunnels_to_listed_names_and_addresses_only() -> None:
    """A listed name goes to the address it had when the phase started; an address only inside a
    listed range; an unlisted name is refused without a lookup."""
    target = netns.listed_target(
        Resolved(
            networks=(ipaddress.ip_network("192.0.2.9/32"), ipaddress.ip_network("10.0.0.0/8")),
            names=(("pypi.org", "192.0.2.9"),),
        )
    )
    assert target("PyPI.org.") == "192.0.2.9"
    assert target("10.1.2.3") == "10.1.2.3"
    assert target("192.0.2.10") is None
    assert target("example.com") is None
    assert target("localhost") is None


def test_a_deny_list_proxy_refuses_the_denied_names_their_subdomains_and_addresses() -> None:
    """Under a deny list every name and address goes through but the denied: a denied name (or a
    subdomain of one), an address it resolved to, and a name that resolves to one (the host's
    resolver: ``localhost`` stands for a name that resolves to a denied address)."""
    target = netns.listed_target(
        Resolved(
            networks=EVERYWHERE,
            denied=(ipaddress.ip_network("192.0.2.9/32"), ipaddress.ip_network("127.0.0.1/32")),
            denied_names=("blocked.example",),
        )
    )
    assert target("blocked.example") is None and target("API.Blocked.Example.") is None
    assert target("192.0.2.9") is None and target("localhost") is None
    assert target("192.0.2.10") == "192.0.2.10"
    assert target("notblocked.example") is None  # no such name here: nothing to tunnel to
    assert target("ip6-localhost") in {"::1", None}  # another name: resolved, not denied


async def test_an_allow_list_proxy_refuses_what_it_does_not_list() -> None:
    handler = netns._connect_handler(netns.listed_target(Resolved()))
    proxy = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        refused = await _ask(proxy.sockets[0].getsockname()[1], b"CONNECT 127.0.0.1:9 HTTP/1.1\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 403 ")
    finally:
        proxy.close()
