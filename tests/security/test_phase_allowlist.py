"""Red team, issue 30: a phase with an allow-list (``network_mode: allowlist`` + ``allowed_hosts``)
reaches the addresses listed and nothing else, each phase its own list.

No internet here, so "outside" is a network namespace this test makes, joined to the host by a
veth pair (addresses of a random ``10.251.N.0/24``): one TCP server in it answers on two
addresses, `LISTED` for the agent phase's list and `VERIFIER_LISTED` for the verifier's. The
oracle and the test script each try both (directly, and through ``$HTTPS_PROXY``'s ``CONNECT``
where set, as the local sandbox names its allow-list proxy), and report what answered as items of
reward.json; the server records who reached which address.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.test_phase_network import KNOCK, run, write_task

REROLL = str(Path(sys.executable).parent / "reroll")
pytestmark = pytest.mark.slow

PROBE = (
    '''"""For each of $TARGETS (host:port ...), print 1 if its server answered NAME (argv[1]) directly
or through $HTTPS_PROXY's CONNECT, else 0; one line, space-separated."""'''
    + KNOCK
    + r"""
name, proxy = sys.argv[1], os.environ.get("HTTPS_PROXY")
ways = [None] + ([tuple(urlsplit(proxy)[1].rsplit(":", 1))] if proxy else [])
ways = [(way[0], int(way[1])) if way else None for way in ways]
print(" ".join(str(max(knock(t, name, way) for way in ways)) for t in os.environ["TARGETS"].split()))
"""
)
SOLVE = """#!/bin/sh
python3 "$(dirname "$0")/probe.py" agent > "${REROLL_WORKSPACE:-/app}/agent-reached"
"""
TEST_SH = """#!/bin/sh
LOGS="${REROLL_LOGS_DIR:-/logs}/verifier"
mkdir -p "$LOGS"
set -- $(cat "${REROLL_WORKSPACE:-/app}/agent-reached" 2>/dev/null || echo 0 0)
A1=$1 A2=$2
set -- $(python3 "$(dirname "$0")/probe.py" verifier)
printf '{"reward": 1, "agent_listed": %s, "agent_other": %s,' "$A1" "$A2" > "$LOGS/reward.json"
printf ' "verifier_listed": %s, "verifier_other": %s}\\n' "$2" "$1" >> "$LOGS/reward.json"
"""
TASK_MD = """---
schema_version: '1.3'
name: NAME
agent:
  timeout_sec: 120
  network_mode: allowlist
  allowed_hosts: [AGENT_HOST]
verifier:
  timeout_sec: 120
  network_mode: allowlist
  allowed_hosts: [VERIFIER_HOST]
  env:
    TARGETS: TARGETS_LIST
sandbox:
  cpus: 1
  memory_mb: 1024
oracle:
  env:
    TARGETS: TARGETS_LIST
---

## prompt

Nothing to do.
"""
SERVER = r"""
import socket, sys
server = socket.create_server(("0.0.0.0", 0))
print(server.getsockname()[1], flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.settimeout(5)
        try:
            name = conn.recv(64).decode(errors="replace").strip()
            print(f"{conn.getsockname()[0]} {name}", flush=True)
            conn.sendall(b"ok\n")
        except OSError:
            pass
"""


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def outside(program: str = SERVER, *args: str) -> Iterator[tuple[str, str, int, list[str]]]:
    """A network namespace with addresses ``10.251.N.2`` and ``.3``, routed from the host through a
    veth pair, and a TCP server in it on every address (`program`: Python source run with
    `args`, printing its port first, then a line per client); ``(first, second, port, lines
    seen: "ADDRESS NAME" of `SERVER`)``."""
    if os.geteuid() != 0:
        pytest.skip("making a network namespace needs root")
    tag, subnet = secrets.token_hex(3), f"10.251.{secrets.randbelow(250) + 2}"
    namespace, host_end, inner_end = f"rr-allow-{tag}", f"rrah{tag}", f"rran{tag}"
    sh("ip", "netns", "add", namespace)
    server = None
    try:
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", inner_end, "netns", namespace)
        sh("ip", "addr", "add", f"{subnet}.1/24", "dev", host_end)
        sh("ip", "link", "set", host_end, "up")
        inside = ["ip", "netns", "exec", namespace]
        for address in (f"{subnet}.2/24", f"{subnet}.3/24"):
            sh(*inside, "ip", "addr", "add", address, "dev", inner_end)
        sh(*inside, "ip", "link", "set", inner_end, "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        sh(*inside, "ip", "route", "add", "default", "via", f"{subnet}.1")
        server = subprocess.Popen(
            [*inside, sys.executable, "-c", program, *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"{subnet}.2", f"{subnet}.3", port, _lines_after(server)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            time.sleep(0.1)  # the reader's last lines
            assert server.stdout is not None
            server.stdout.close()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)


def _lines_after(server: subprocess.Popen[str]) -> list[str]:
    """A list that fills, on a thread, with the server's lines."""
    seen: list[str] = []

    def read() -> None:
        assert server.stdout is not None
        with contextlib.suppress(ValueError, OSError):  # closed by `outside`
            seen.extend(line.strip() for line in server.stdout)

    threading.Thread(target=read, daemon=True).start()
    return seen


def make_task(root: Path, agent_host: str | None, verifier_host: str, targets: str) -> Path:
    """A native task whose agent phase may reach `agent_host` only (None: everything, ``public``)
    and its verifier `verifier_host` only; both try every address of `targets` (``host:port
    host:port``, `agent_host`'s first)."""
    text = TASK_MD.replace("NAME", root.name)
    if agent_host is None:
        text = text.replace(
            "  network_mode: allowlist\n  allowed_hosts: [AGENT_HOST]\n", "  network_mode: public\n", 1
        )
    text = text.replace("AGENT_HOST", agent_host or "")
    text = text.replace("VERIFIER_HOST", verifier_host).replace("TARGETS_LIST", f"'{targets}'")
    files = {"task.md": text, "environment/Dockerfile": "FROM reroll/base:bookworm\nWORKDIR /app\n"}
    files |= {"oracle/solve.sh": SOLVE, "verifier/test.sh": TEST_SH}
    return write_task(root, files | {f"{folder}/probe.py": PROBE for folder in ("oracle", "verifier")})


def test_each_phase_reaches_its_own_allow_list_and_nothing_else(sandbox_backend: str, tmp_path: Path) -> None:
    with outside() as (first, second, port, seen):
        task = make_task(tmp_path / "allowlist", first, second, f"{first}:{port} {second}:{port}")
        checked = subprocess.run(
            [REROLL, "task", "check", str(task)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "400"},
        )
        result = run(task, tmp_path / "jobs", sandbox_backend)
    assert f"agent (and oracle) none + allowed: {first}" in checked.stdout, checked.stdout
    assert f"verifier none + allowed: {second}" in checked.stdout, checked.stdout
    assert result["status"] == "ok", result.get("error")
    rewards = result["rewards"]
    assert (rewards["agent_listed"], rewards["agent_other"]) == (1.0, 0.0), rewards
    assert (rewards["verifier_listed"], rewards["verifier_other"]) == (1.0, 0.0), rewards
    assert sorted(seen) == sorted([f"{first} agent", f"{second} verifier"]), seen
    assert result["config"]["network_phases"]["agent_allowed"] == [first]


def test_a_verifier_s_allow_list_after_a_public_agent(sandbox_backend: str, tmp_path: Path) -> None:
    """docker: the agent reaches both addresses, the verify only its own; `local` refuses the task
    (pasta's route out of a full agent phase would outlive the list)."""
    with outside() as (first, second, port, seen):
        task = make_task(tmp_path / "verifier-allowlist", None, second, f"{first}:{port} {second}:{port}")
        result = run(task, tmp_path / "jobs", sandbox_backend)
    if sandbox_backend == "local":
        assert result["status"] == "error" and "holds no allow-list" in str(result.get("error")), result
        assert seen == [], seen
        return
    assert result["status"] == "ok", result.get("error")
    rewards = result["rewards"]
    assert (rewards["agent_listed"], rewards["agent_other"]) == (1.0, 1.0), rewards
    assert (rewards["verifier_listed"], rewards["verifier_other"]) == (1.0, 0.0), rewards
    assert sorted(seen) == sorted([f"{first} agent", f"{second} agent", f"{second} verifier"]), seen
