"""Red team, issue 30: each phase of a rollout reaches only what its own network policy lets it.

Tasks in BenchFlow's native format (``task.md``, ``environment/``, ``oracle/``, ``verifier/``)
whose oracle and test script both try to reach an "outside" server: a listener of this test on
the host's address on another interface than the default route's (docker0's here; no internet
exists), which a sandbox with network ``full`` reaches and one with ``none`` does not. Each
phase reports what it reached as an item of reward.json, and the server records who knocked.

- ``sandbox.network_mode: public`` with ``verifier.network_mode: no-network``: the agent reaches
  the outside; the verify, run after it in the same sandbox, must not (before issue 30 the
  verifier's policy was ignored: it connected).
- ``sandbox.network_mode: no-network`` with ``verifier.network_mode: public``: the agent does not
  reach the outside and leaves a daemon that keeps knocking; the verify reaches it, the daemon
  never does (the agent's processes end before the verify gets its network), also in Harbor's
  layout (``task.toml``), where the oracle's processes otherwise stay alive for the script.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REROLL = str(Path(sys.executable).parent / "reroll")
NO_LISTS: dict[str, list[str]] = {
    "agent_allowed": [],
    "agent_denied": [],
    "agent_blocked_urls": [],
    "verifier_allowed": [],
}
pytestmark = pytest.mark.slow

KNOCK = r'''
import os, socket, sys
from urllib.parse import urlsplit

def knock(target, name, proxy):
    """1 when the server at `target` (host:port) answered `name`, directly or through `proxy`'s
    (host, port) CONNECT, else 0."""
    host, port = target.rsplit(":", 1)
    try:
        if proxy:
            sock = socket.create_connection(proxy, timeout=5)
            sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            if b" 200 " not in sock.recv(4096):
                return 0
        else:
            sock = socket.create_connection((host, int(port)), timeout=5)
        with sock:
            sock.sendall(name.encode() + b"\n")
            return 1 if sock.recv(16).startswith(b"ok") else 0
    except OSError:
        return 0
'''
"""The probes' knock on a test server (which answers ``ok`` to a line), shared by the security tests."""
PROBE = (
    r'''
"""Knock on $OUTSIDE (host:port) as NAME: directly, or through $HTTPS_PROXY's CONNECT where set
(the local sandbox lends the verify such a proxy); print 1 when the server answered, else 0.
The daemon, which has no such variable, tries every listening TCP socket it sees as a proxy too."""
'''
    + KNOCK
    + r"""
def listeners():
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            address, port = local.split(":")
            yield socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(port, 16)

name, proxy = sys.argv[1], os.environ.get("HTTPS_PROXY")
proxies = [urlsplit(proxy)[1].rsplit(":", 1) if proxy else None]
if name == "daemon":
    proxies += list(listeners())
print(max(knock(os.environ["OUTSIDE"], name, (p[0], int(p[1])) if p else None) for p in proxies))
"""
)
DAEMON = "while true; do python3 /tmp/probe.py daemon; sleep 0.2; done"
SERVICE_PORT = 8123
"""A service the oracle leaves on the sandbox's loopback (kept for the verify in Harbor's layout)."""
SOLVE = f"""#!/bin/sh
cp "$(dirname "$0")/probe.py" /tmp/probe.py
python3 /tmp/probe.py agent > "${{REROLL_WORKSPACE:-/app}}/agent-reached"
setsid sh -c '{DAEMON}' </dev/null >/dev/null 2>&1 &
setsid python3 -m http.server {SERVICE_PORT} --bind 127.0.0.1 </dev/null >/dev/null 2>&1 &
sleep 1
exit 0
"""
TEST_SH = """#!/bin/sh
LOGS="${REROLL_LOGS_DIR:-/logs}/verifier"
mkdir -p "$LOGS"
AGENT=$(cat "${REROLL_WORKSPACE:-/app}/agent-reached" 2>/dev/null || echo 0)
VERIFIER=$(python3 "$(dirname "$0")/probe.py" verifier)
SERVICE=$(python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8123), 3); print(1)' || echo 0)
printf '{"reward": 1, "agent_reached": %s, "service_reached": %s,' "$AGENT" "$SERVICE" > "$LOGS/reward.json"
printf ' "verifier_reached": %s}\\n' "$VERIFIER" >> "$LOGS/reward.json"
"""
TASK_MD = """---
schema_version: '1.3'
name: NAME
agent:
  timeout_sec: 120
verifier:
  timeout_sec: 120
  network_mode: VERIFIER
  env:
    OUTSIDE: ${REROLL_TEST_OUTSIDE}
sandbox:
  network_mode: AGENT
  cpus: 1
  memory_mb: 1024
oracle:
  env:
    OUTSIDE: ${REROLL_TEST_OUTSIDE}
---

## prompt

Nothing to do.
"""


TASK_TOML = """schema_version = "1.3"
[agent]
timeout_sec = 120
[verifier]
timeout_sec = 120
network_mode = "VERIFIER"
env = { OUTSIDE = "${REROLL_TEST_OUTSIDE}" }
[environment]
network_mode = "AGENT"
cpus = 1
memory_mb = 1024
[solution]
env = { OUTSIDE = "${REROLL_TEST_OUTSIDE}" }
"""


def make_task(root: Path, agent: str, verifier: str, harbor: bool = False) -> Path:
    """A task whose sandbox (the agent's phase) has network_mode `agent`, its verifier `verifier`:
    in BenchFlow's native layout, or with `harbor` in Harbor's (``task.toml``, ``solution/``,
    ``tests/``), where the oracle's processes outlive it into the verify (Harbor's semantics)."""
    solution, tests = ("solution", "tests") if harbor else ("oracle", "verifier")
    config = TASK_TOML if harbor else TASK_MD.replace("NAME", root.name)
    files = {
        "task.toml" if harbor else "task.md": config.replace("AGENT", agent).replace("VERIFIER", verifier),
        "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n",
        f"{solution}/solve.sh": SOLVE,
        f"{solution}/probe.py": PROBE,
        f"{tests}/test.sh": TEST_SH,
        f"{tests}/probe.py": PROBE,
    }
    if harbor:
        files["instruction.md"] = "Nothing to do.\n"
    return write_task(root, files)


def write_task(root: Path, files: dict[str, str]) -> Path:
    """`root` with each of `files` (relative path → text) written; `root`."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def outside_address() -> str:
    """The host's IPv4 address on an interface other than the default route's and loopback: a
    sandbox's gateway maps the default one to the sandbox itself (pasta), this one it reaches."""

    def ip(*args: str) -> Any:
        done = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    default = {entry.get("dev") for entry in ip("route", "show", "default")}
    for link in ip("-4", "addr"):
        if link["ifname"] != "lo" and link["ifname"] not in default and link.get("addr_info"):
            return str(link["addr_info"][0]["local"])
    pytest.skip("no host address outside the default route's interface to stand for the outside")


@contextlib.contextmanager
def outside() -> Iterator[tuple[str, list[str]]]:
    """A TCP server on `outside_address` answering ``ok`` to every line; ``(host:port, names seen)``."""
    seen: list[str] = []
    server = socket.create_server((outside_address(), 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    seen.append(conn.recv(64).decode(errors="replace").strip())
                    conn.sendall(b"ok\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    host, port = server.getsockname()[:2]
    try:
        yield f"{host}:{port}", seen
    finally:
        stop.set()
        thread.join()
        server.close()


def run(task: Path, jobs: Path, backend: str, address: str = "") -> dict[str, Any]:
    """`reroll run TASK --agent oracle` with the outside's address for the task's templates: its
    result.json, with its config.json under ``config``."""
    done = subprocess.run(
        [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", str(jobs)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "REROLL_TEST_OUTSIDE": address},
    )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = jobs.glob("*/*/result.json")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["config"] = json.loads((result_file.parent / "config.json").read_text())
    return result


@pytest.mark.parametrize("harbor", [False, True], ids=["benchflow", "harbor"])
def test_a_no_network_verifier_does_not_reach_what_the_agent_reached(
    harbor: bool, sandbox_backend: str, tmp_path: Path
) -> None:
    """It reaches the sandbox's own loopback service still (Harbor's layout keeps the oracle's
    server alive for it; BenchFlow's ends it)."""
    task = make_task(tmp_path / "verifier-no-network", agent="public", verifier="no-network", harbor=harbor)
    with outside() as (address, seen):
        result = run(task, tmp_path / "jobs", sandbox_backend, address)
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"]["agent_reached"] == 1.0, "the outside stands for what a full sandbox reaches"
    assert result["rewards"]["verifier_reached"] == 0.0, result["rewards"]
    assert result["rewards"]["service_reached"] == float(harbor), result["rewards"]
    assert "verifier" not in seen and "agent" in seen, seen
    assert result["config"]["network_phases"] == {"agent": "full", "verifier": "none", **NO_LISTS}


@pytest.mark.parametrize("harbor", [False, True], ids=["benchflow", "harbor"])
def test_a_public_verifier_gets_the_network_the_agent_never_had(
    harbor: bool, sandbox_backend: str, tmp_path: Path
) -> None:
    """In Harbor's layout the oracle's daemon would be kept alive for the script: not here."""
    task = make_task(tmp_path / "verifier-public", agent="no-network", verifier="public", harbor=harbor)
    with outside() as (address, seen):
        result = run(task, tmp_path / "jobs", sandbox_backend, address)
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"]["agent_reached"] == 0.0, result["rewards"]
    assert result["rewards"]["verifier_reached"] == 1.0, result["rewards"]
    assert seen.count("verifier") == 1 and "agent" not in seen and "daemon" not in seen, seen
    assert result["config"]["network_phases"] == {"agent": "none", "verifier": "full", **NO_LISTS}
