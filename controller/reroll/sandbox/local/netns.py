"""Network policy ``none`` of the isolated local sandbox: a loopback-only network namespace into
which the controller forwards the LLM proxy's ports, and nothing else.

Why not a veth pair: a veth gives the namespace a route to the host, and the host accepts on it
every address it owns (its other interfaces, ``0.0.0.0`` listeners); only firewall rules kept in
step with the proxy's ports would close that, and they outlive a killed controller. A namespace
with nothing but ``lo`` has no route anywhere by construction: the only way out is a listening
socket the controller creates *inside* it (a socket stays in the namespace it was made in, see
`listen_in`) and serves from its own, host-side event loop.

Which ports: the sandbox gets a loopback address of its own on the host (`private_loopback`,
e.g. ``127.83.17.201``), and its `host_address` is that one; the LLM proxy (and the HTTPS
interceptor) bind there before the sandbox starts, so every TCP port listening on exactly that
address (`listening_ports`, from ``/proc/net/tcp``) is the sandbox's and is forwarded at the
same address and port inside. A listener of anything else on the host (on ``127.0.0.1``,
``0.0.0.0`` or another address) is unreachable.

Installing an agent needs PyPI: `connect_proxy` lends an HTTP ``CONNECT`` proxy inside the
namespace for the install only (`Sandbox.egress`). Network ``full`` is the same namespace with
pasta attached (`attach_pasta`).

An allow-list (a phase's ``allowed_hosts``) is the same proxy checking each ``CONNECT`` against
the list resolved on the host (`listed_proxy`, `listed_target`), named to every process by the
proxy variables: the namespace still has no route out, so a client that ignores the variables
(or a root in the sandbox that rewrites them, or the namespace's firewall) reaches nothing, where
rules inside the namespace would be the sandbox root's to flush. What it costs: only clients that
tunnel through an HTTP proxy (HTTPS ones do; plain ``http://`` only where the client tunnels it
too), TCP only. A deny list (the agent phase's ``blocked_hosts``) is that proxy allowing every
name and address but the denied ones (`listed_target`): the same costs, as BenchFlow's own
denylist proxy has.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import os
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from reroll_contracts.errors import SandboxError
from reroll_contracts.namespaces import CLONE_NEWNET

from reroll.host.child_process import exit_description
from reroll.sandbox.allowlist import Resolved
from reroll.sandbox.local.rootview import DNS_FORWARD

LISTEN_STATE = "0A"
"""TCP state LISTEN in ``/proc/net/tcp``."""
BUFFER_BYTES = 64 * 1024
REQUEST_HEAD_LIMIT_BYTES = 16 * 1024
CONNECT_TIMEOUT_SECONDS = 30.0


def proxy_env(url: str, direct: str = "") -> dict[str, str]:
    """The variables that send HTTP(S) clients through the proxy at `url`, all but `direct`
    (an address: the LLM proxy's) and loopback."""
    names = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")
    env = {name: url for name in names}
    if direct:
        env |= {name: f"{direct},localhost,127.0.0.1,::1" for name in ("NO_PROXY", "no_proxy")}
    return env


def private_loopback() -> str:
    """A random address of ``127.0.0.0/8`` other than the usual ``127.0.0.x``/``127.0.1.x``."""
    return f"127.{secrets.randbelow(250) + 3}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def listening_ports(address: str, proc_net_tcp: Path = Path("/proc/net/tcp")) -> list[int]:
    """TCP ports listening on exactly `address` (IPv4) in this process's network namespace, sorted."""
    wanted = socket.inet_aton(address)[::-1].hex().upper()  # /proc shows the address little-endian
    ports = set()
    for line in proc_net_tcp.read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        host, _, port = local.partition(":")
        if host == wanted and state == LISTEN_STATE:
            ports.add(int(port, 16))
    return sorted(ports)


def listen_in(namespace: str, address: str, port: int) -> socket.socket:
    """A TCP socket listening on ``address:port`` inside the network namespace at path `namespace`
    (``/proc/PID/ns/net``), made on a thread of its own that joins the namespace and then ends.

    Raises:
        OSError: the namespace cannot be joined (needs CAP_SYS_ADMIN) or the bind failed.
    """
    made: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            with open(namespace, "rb") as handle:
                if ctypes.CDLL(None, use_errno=True).setns(handle.fileno(), CLONE_NEWNET):
                    code = ctypes.get_errno()
                    raise OSError(code, f"joining {namespace}: {os.strerror(code)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(128)
            sock.setblocking(False)
            made.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            made.append(exc)

    thread = threading.Thread(target=make, name="netns-listen")  # never reused in another namespace
    thread.start()
    thread.join()
    (result,) = made
    if isinstance(result, BaseException):
        raise result
    return result


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until end of file, then half-close `writer`.

    Raises:
        OSError: either connection failed (a reset): `_splice` passes that on as a reset.
    """
    while data := await reader.read(BUFFER_BYTES):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close `writer`'s connection with a TCP reset (SO_LINGER 0), as the other side's was."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _splice(
    inner: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    outer: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy both ways between two connections until both ends are done, then close them. A
    reset of either connection resets the other, so the agent sees what the proxy did (a cut,
    an injected reset) and does not wait for bytes that will never come."""
    pumps = [
        asyncio.ensure_future(_pump(inner[0], outer[1])),
        asyncio.ensure_future(_pump(outer[0], inner[1])),
    ]
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
        if any(not pump.cancelled() and pump.exception() is not None for pump in done):
            for _, writer in (inner, outer):
                _reset(writer)
        await asyncio.gather(*pumps, return_exceptions=True)
    finally:
        for pump in pumps:
            pump.cancel()
        for _, writer in (inner, outer):
            writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _forward_to(host: str, port: int) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            outer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_SECONDS)
        except (OSError, TimeoutError):
            writer.close()
            return
        await _splice((reader, writer), outer)

    return handle


Target = Callable[[str], "str | None"]
"""Where a ``CONNECT`` to a host (a name or an address, as the client sent it) goes: the address
to open, or None when the proxy refuses it."""


def _anywhere(host: str) -> str | None:
    return host


def listed_target(allowed: Resolved) -> Target:
    """A `Target` for an allow-list: a listed name goes to the first address it resolved to when
    the phase started (never resolved again), an address only when one of `allowed`'s networks
    holds it; anything else is refused. Under a deny list (`Resolved.denied_names`: every address
    allowed) a name is resolved on the host now, and refused when it is denied (or a subdomain of
    a denied name) or resolves to a denied address; a denied address is refused."""
    by_name: dict[str, str] = {}
    for name, address in allowed.names:
        by_name.setdefault(name, address)

    def target(host: str) -> str | None:
        host = host.lower().rstrip(".")
        if allowed.denies(host):
            return None
        if host in by_name:
            return by_name[host]
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if not allowed.denied_names:
                return None
            resolved = _first_address(host)  # a deny list allows every other name
            return resolved if resolved is not None and not allowed.denies(resolved) else None
        return host if any(address in network for network in allowed.networks) else None

    return target


def _first_address(name: str) -> str | None:
    """The first address the host's resolver gives for `name`; None when none."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return None
    return str(infos[0][4][0]).partition("%")[0] if infos else None


def _connect_handler(target: Target) -> Handler:
    """One HTTP ``CONNECT host:port`` request: a tunnel to `target`'s address for it from the
    host's network, or ``403 Forbidden`` where `target` refuses it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT_SECONDS)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        method, _, rest = head.decode("latin-1").partition(" ")
        host, _, port = rest.partition(" ")[0].rpartition(":")
        if method != "CONNECT" or not port.isdigit():
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\nonly CONNECT\n")
            writer.close()
            return
        address = await asyncio.to_thread(target, host.strip("[]"))  # a deny list's lookup blocks
        if address is None:
            writer.write(
                b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\n\r\nnot in this phase's allow-list\n"
            )
            writer.close()
            return
        try:
            outer = await asyncio.wait_for(
                asyncio.open_connection(address, int(port)), CONNECT_TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError) as exc:
            writer.write(f"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n{exc}\n".encode())
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await _splice((reader, writer), outer)

    return handle


class Forwarder:
    """The host-side servers of one sandbox's network namespace; `close` stops them all."""

    def __init__(self, namespace: str, address: str) -> None:
        self.namespace = namespace
        self.address = address
        self._servers: list[asyncio.Server] = []
        self._open: set[asyncio.StreamWriter] = set()
        self._forwarded: set[int] = set()
        self._forwarding = asyncio.Lock()
        self._allowed: Target = listed_target(Resolved())

    async def _serve(self, port: int, handler: Handler, address: str = "") -> int:
        sock = await asyncio.to_thread(listen_in, self.namespace, address or self.address, port)

        async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._open.add(writer)
            try:
                await handler(reader, writer)
            finally:
                self._open.discard(writer)

        server = await asyncio.start_server(tracked, sock=sock, limit=REQUEST_HEAD_LIMIT_BYTES)
        self._servers.append(server)
        bound: int = sock.getsockname()[1]
        return bound

    async def forward_host_ports(self) -> list[int]:
        """Forward every port listening on the host at `address` to the same port inside.

        Returns:
            The ports forwarded.

        Raises:
            OSError: as `listen_in`.
        """
        ports = listening_ports(self.address)
        for port in ports:
            await self.forward_port(port)
        return ports

    async def forward_port(self, port: int) -> None:
        """Forward the host's `address`:`port` to the same port inside (once; again is a no-op).

        Raises:
            OSError: as `listen_in`.
        """
        async with self._forwarding:  # two callers at once (a start's scan, a port opened) bind once
            if port not in self._forwarded:
                await self._serve(port, _forward_to(self.address, port))
                self._forwarded.add(port)

    async def forward_alias(self, address: str, port: int, to_port: int) -> None:
        """Forward `address`:`port` inside (another sandbox's address, which a process restored
        from a checkpoint of that sandbox still connects to: `reroll.sandbox.local.criu`) to the
        host's `address` attribute:`to_port`.

        Raises:
            OSError: as `listen_in` (e.g. `address` is not a loopback address).
        """
        await self._serve(port, _forward_to(self.address, to_port), address)

    async def listed_proxy(self, allowed: Resolved) -> str:
        """An HTTP CONNECT proxy inside the namespace that tunnels only to `allowed`
        (`listed_target`) until `close`; `allow` changes its list.

        Returns:
            The proxy's URL (``http://ADDRESS:PORT``).

        Raises:
            OSError: as `listen_in`.
        """
        self._allowed = listed_target(allowed)
        port = await self._serve(0, _connect_handler(lambda host: self._allowed(host)))
        return f"http://{self.address}:{port}"

    def allow(self, allowed: Resolved | None) -> None:
        """Make `allowed` the list of the `listed_proxy` (None: everything)."""
        self._allowed = _anywhere if allowed is None else listed_target(allowed)

    @contextlib.asynccontextmanager
    async def connect_proxy(self) -> AsyncIterator[str]:
        """An HTTP CONNECT proxy inside the namespace while the context lasts.

        Yields:
            The proxy's URL (``http://ADDRESS:PORT``).
        """
        port = await self._serve(0, _connect_handler(_anywhere))
        server = self._servers[-1]
        try:
            yield f"http://{self.address}:{port}"
        finally:
            self._servers.remove(server)
            server.close()

    async def close(self) -> None:
        """Stop every server and close the connections they accepted."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for writer in list(self._open):
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)


PASTA_PID_TIMEOUT_SECONDS = 2.0
"""How long `attach_pasta` waits for pasta's pid file (to stop it with the sandbox)."""
PASTA_OPTIONS = ["--config-net", "--quiet", "--no-map-gw"]
PASTA_OPTIONS += ["-t", "none", "-u", "none", "-T", "none", "-U", "none"]
"""pasta (network ``full``): configure the namespace's interface like the host's, map no port
either way and not the gateway to the host's loopback."""


async def attach_pasta(pid: int, folder: Path) -> int | None:
    """Give the network namespace of process `pid` (a sandbox's) outbound access through pasta
    (network ``full``, `reroll.sandbox.local.isolated`), logging to ``<folder>/pasta.log``.

    Returns:
        pasta's pid (to stop it with the sandbox); None if it did not say in time.

    Raises:
        SandboxError: pasta is missing or failed.
    """
    pasta = shutil.which("pasta")
    if pasta is None:
        raise SandboxError("network full in the isolated local sandbox needs pasta (Debian's passt)")
    handle, pid_path = tempfile.mkstemp(prefix="reroll-pasta-", suffix=".pid")  # root's: pasta writes it
    os.close(handle)
    pid_file = Path(pid_path)
    # pasta drops its capabilities before it opens the namespace, and then may not open
    # another user's /proc/PID/ns/net: it gets the namespace as a descriptor opened here.
    netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with open(folder / "pasta.log", "ab") as log:  # the daemon keeps it: no pipe to wait on
            process = await asyncio.create_subprocess_exec(
                pasta,
                *PASTA_OPTIONS,
                *(["--dns-forward", DNS_FORWARD] if _dns_forwarded(folder) else []),
                *("--runas", "0:0", "--pid", str(pid_file)),
                *("--netns", f"/proc/self/fd/{netns}", "--netns-only"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(netns,),
            )
            code = await process.wait()  # pasta forks to the background once configured
    finally:
        os.close(netns)
    if code != 0:
        log_text = (folder / "pasta.log").read_text(errors="replace")
        raise SandboxError(f"pasta failed (exited with {exit_description(code)}): {log_text[-2000:]}")
    found = None
    deadline = time.monotonic() + PASTA_PID_TIMEOUT_SECONDS
    while found is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            found = int(pid_file.read_text().strip())
        await asyncio.sleep(0.005)
    pid_file.unlink(missing_ok=True)
    return found


def _dns_forwarded(folder: Path) -> bool:
    """Whether the sandbox's resolv.conf (``<folder>/etc``) names pasta's forwarded address (a
    loopback host resolver)."""
    with contextlib.suppress(OSError):
        return DNS_FORWARD in (folder / "etc" / "resolv.conf").read_text()
    return False
