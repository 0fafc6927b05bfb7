"""The sandbox's own loopback services, reached from a verify's loopback-only network namespace
(`reroll_sidecar.verify_ns`, a verifier whose network policy is ``none``).

A network namespace of its own keeps the verify away from everything outside the sandbox, and
from the sandbox's loopback too: a task's service on ``127.0.0.1:5432`` (a database the tests
query) would be gone. Harbor's and BenchFlow's no-network verifier runs in the task's container
and reaches it. So each TCP port listening on the sandbox's loopback or on all addresses when the
verify starts (`loopback_ports`: ``127.0.0.1``, ``0.0.0.0``, ``::1``, ``::``) is listened on at
``127.0.0.1`` in the verify's namespace (`listen_all`, by the launcher's child, which is inside
it) and relayed by the launcher, which stays in the sandbox's, to the same port on the sandbox's
loopback (`relay`). Not relayed: ports on any other address — the LLM proxy's and an allow-list
proxy's on the `local` sandbox's private ``127.x.y.z``, none at all in a container — so the verify
still reaches no model and nothing outside.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

LISTEN_STATE = "0A"
"""TCP state LISTEN in ``/proc/net/tcp``."""
LOOPBACK_OR_ANY = {
    "0100007F",  # 127.0.0.1, as /proc/net/tcp spells it (little-endian)
    "00000000",  # 0.0.0.0
    "00000000000000000000000001000000",  # ::1
    "00000000000000000000000000000000",  # ::
}
BUFFER_BYTES = 64 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0


def loopback_ports(proc_net: Path = Path("/proc/net")) -> list[int]:
    """TCP ports listening on loopback or on all addresses in this process's network namespace,
    sorted (``tcp`` and ``tcp6`` of `proc_net`; a missing file counts as none)."""
    ports = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc_net / name).read_text().splitlines()[1:]:
                fields = line.split()
                address, _, port = fields[1].partition(":")
                if fields[3] == LISTEN_STATE and address in LOOPBACK_OR_ANY:
                    ports.add(int(port, 16))
    return sorted(ports)


def listen_all(ports: list[int]) -> list[socket.socket]:
    """A socket listening on ``127.0.0.1:PORT`` in this process's network namespace for each of
    `ports` (one that cannot be bound is left out)."""
    listeners = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(64)
        except OSError:
            sock.close()
            continue
        listeners.append(sock)
    return listeners


def relay(listeners: list[socket.socket]) -> None:
    """Serve each of `listeners` (made in another namespace) on daemon threads: every connection
    is spliced to the same port on this namespace's loopback (``127.0.0.1``, else ``::1``); one
    that cannot be opened is closed at once."""
    for listener in listeners:
        threading.Thread(target=_accept, args=(listener,), daemon=True, name="loopback-relay").start()


def _accept(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    while True:
        try:
            inner, _ = listener.accept()
        except OSError:
            return
        outer = None
        for host in ("127.0.0.1", "::1"):
            with contextlib.suppress(OSError):
                outer = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS)
                break
        if outer is None:
            inner.close()
            continue
        outer.settimeout(None)
        threading.Thread(target=_splice, args=(inner, outer), daemon=True).start()


def _splice(inner: socket.socket, outer: socket.socket) -> None:
    """Copy both ways until both ends are done, then close both."""
    back = threading.Thread(target=_pump, args=(outer, inner), daemon=True)
    back.start()
    _pump(inner, outer)
    back.join()
    for sock in (inner, outer):
        sock.close()


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy `source` to `target` until end of file, then half-close `target`; on a failure close
    both (the other pump then ends too)."""
    try:
        while data := source.recv(BUFFER_BYTES):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, target):
            sock.close()
