"""A verify's own namespaces (`reroll_sidecar.verify_ns`), for real (root, or a host that allows
unprivileged user namespaces): what the script leaves in IPC, processes and /tmp dies with it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid

import pytest
from reroll_sidecar import verify_ns

pytestmark = pytest.mark.spawns


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    if why := verify_ns.available():
        pytest.skip(why)


def ns_exec(script: str, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "reroll_sidecar", "ns-exec", *options, "--", "sh", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_the_script_is_pid_1_and_its_exit_status_comes_back() -> None:
    done = ns_exec("echo $$; exit 7")
    assert (done.returncode, done.stdout.strip()) == (7, "1"), done.stderr


def test_a_shared_memory_segment_and_a_detached_process_die_with_the_verify() -> None:
    mark = f"reroll-ns-{uuid.uuid4().hex}"
    made = ns_exec(f"ipcmk -M 4096 >/dev/null && ipcs -m | grep -c . ; (setsid sleep 300 {mark} &) ; exit 0")
    assert made.returncode == 0, made.stderr
    survivors = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True, check=False)
    assert survivors.stdout == "", survivors.stdout
    fresh = ns_exec("ipcs -m | grep -c '^0x'")
    assert fresh.stdout.strip() == "0", fresh.stdout


def test_a_soft_verify_gets_an_empty_tmp_of_its_own() -> None:
    mark = f"/tmp/reroll-ns-{uuid.uuid4().hex}"
    done = ns_exec(f"ls /tmp | wc -l; echo x > {mark}", "--fresh-tmp")
    assert (done.returncode, done.stdout.strip()) == (0, "0"), done.stderr
    assert subprocess.run(["test", "-e", mark], check=False).returncode == 1


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_a_stricter_verifier_has_only_loopback_of_its_own() -> None:
    """``--own-net``: a listener on another address than loopback (the local sandbox's private
    ``127.x.y.z`` of the LLM proxy, the host's other addresses) is out of reach; the namespace's
    own loopback is up (a server the script starts answers)."""
    private = "127.83.17.201"  # as `reroll.sandbox.local.netns.private_loopback` picks one
    with socket.create_server((private, 0)) as outside:
        port = outside.getsockname()[1]
        probe = f"{sys.executable} -c '{CONNECT}'"
        shared = ns_exec(f"{probe} {private} {port}")
        assert shared.stdout.strip() == "connected", shared.stderr  # without --own-net: the host's network
        own = ns_exec(f"{probe} {private} {port}; ip -o link | grep -c . ", "--own-net")
    assert own.returncode == 0, own.stderr
    reached, links = own.stdout.split()
    assert reached != "connected" and links == "1", own.stdout
    server = (
        f"{sys.executable} -m http.server -b 127.0.0.1 8765 >/dev/null 2>&1 & sleep 1; {probe} 127.0.0.1 8765"
    )
    inner = ns_exec(server, "--own-net")
    assert inner.stdout.strip() == "connected", inner.stderr


def test_a_stricter_verifier_still_reaches_the_sandbox_s_loopback_services() -> None:
    """A port listening on the sandbox's loopback or on all its addresses when the verify starts
    (a task's service) answers at ``127.0.0.1`` in the verify's own namespace, both ways; one
    opened after the verify started is not relayed."""
    probe = f"{sys.executable} -c '{ECHO}'"
    with socket.create_server(("127.0.0.1", 0)) as loopback, socket.create_server(("0.0.0.0", 0)) as anywhere:
        served = [
            threading.Thread(target=_echo_once, args=(sock,), daemon=True) for sock in (loopback, anywhere)
        ]
        for thread in served:
            thread.start()
        ports = [sock.getsockname()[1] for sock in (loopback, anywhere)]
        own = ns_exec("; ".join(f"{probe} {port}" for port in ports), "--own-net")
    assert own.returncode == 0, own.stderr
    assert own.stdout.split() == ["echo:ping", "echo:ping"], (own.stdout, own.stderr)


ECHO = """import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as sock:
    sock.sendall(b"ping"); sock.shutdown(socket.SHUT_WR); print(sock.recv(64).decode())"""


def _echo_once(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        conn.sendall(b"echo:" + conn.recv(64))
