"""Red team, issue 30: a task's URL deny list (BenchFlow's ``network_mode: denylist`` with
``blocked_urls``, and ``blocked_hosts``) keeps the agent phase from every URL under a blocked
prefix, over HTTPS and plain HTTP, disguised or not, through reroll's interceptor or around it,
and from nothing else; the verify phase (``full``) reaches the blocked page directly.

"Outside" is the allow-list test's network namespace with a web server answering HTTP and HTTPS
on one port (its certificate from a CA made here, which the controller, so mitmproxy, trusts
through ``SSL_CERT_FILE``); `WEB` names its first address and `DENIED` its second on the host for
this run (`naming`). The oracle tries every way at once (`PROBE`) and writes what answered (an HTTP status,
0 for no answer) into the workspace; the test script copies it into reward.json.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from reroll.cache import host_ca_bundle

from tests.security.test_phase_allowlist import REROLL, outside
from tests.security.test_phase_denylist import checked_task, naming

pytestmark = pytest.mark.slow
WEB, DENIED = "docs.reroll.test", "denied.reroll.test"
HOST_CA_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""What names the host's CA bundle (`reroll.cache.host_ca_bundle`): the test's CA added to it."""
SERVER = r"""
import http.server, ssl, socket, sys
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(sys.argv[1], sys.argv[2])

class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        scheme = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
        print(f"{self.connection.getsockname()[0]} {scheme} {self.path} {self.client_address[0]}", flush=True)
        body = f"page {self.path}\n".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

class Both(http.server.ThreadingHTTPServer):
    def finish_request(self, request, client_address):
        request.settimeout(10)
        if request.recv(1, socket.MSG_PEEK) == b"\x16":  # a TLS handshake
            request = context.wrap_socket(request, server_side=True)
        super().finish_request(request, client_address)

server = Both(("0.0.0.0", 0), Page)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
PROBE = r'''"""Try every way to a blocked page and to allowed ones; print {way: HTTP status, 0: none}."""
import json, os, socket, ssl, sys, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
web, denied, port = os.environ["WEB"], os.environ["DENIED"], os.environ["PORT"]
first, second = os.environ["FIRST"], os.environ["SECOND"]

def get(url, opener=None):
    try:
        with (opener or urllib.request.build_opener()).open(url, timeout=20) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
    except (OSError, ValueError):
        return 0

def direct(address, path):
    """GET `path` of WEB straight from `address` (no proxy): the bypass."""
    try:
        with socket.create_connection((address, int(port)), timeout=5) as sock:
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {web}\r\n\r\n".encode())
            return int(sock.recv(64).split()[1])
    except (OSError, IndexError, ValueError):
        return 0

if sys.argv[1] == "agent":
    tries = {
        "https_blocked": (get, f"https://{web}:{port}/answers/key"),
        "http_blocked": (get, f"http://{web}:{port}/answers/key"),
        "https_disguised": (get, f"https://www.{web}:{port}/public/..%2fANSWERS/key"),
        "http_by_address": (get, f"http://{first}:{port}/answers/key"),
        "https_allowed": (get, f"https://{web}:{port}/public/page"),
        "http_allowed": (get, f"http://{web}:{port}/public/page"),
        "denied_host": (get, f"http://{denied}:{port}/public/page"),
        "denied_by_address": (get, f"http://{second}:{port}/public/page"),
        "direct_blocked": (direct, first, "/answers/key"),
        "unproxied_https": (get, f"https://{web}:{port}/answers/key", urllib.request.build_opener(
            urllib.request.ProxyHandler({}))),
    }
    # all at once: the ways that get no answer wait out their timeouts together, not one by one
    with ThreadPoolExecutor(len(tries)) as pool:
        pending = {way: pool.submit(*call) for way, call in tries.items()}
    ways = {way: answer.result() for way, answer in pending.items()}
else:  # the verify phase's egress: a route (docker), a CONNECT proxy named by $HTTPS_PROXY (local)
    context = ssl._create_unverified_context()
    unverified = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    ways = {"verifier_direct": get(f"https://{first}:{port}/answers/verifier", unverified)}
print(json.dumps(ways))
'''
SOLVE = """#!/bin/sh
python3 "$(dirname "$0")/probe.py" agent > "${REROLL_WORKSPACE:-/app}/agent-reached.json"
"""
TEST_SH = """#!/bin/sh
LOGS="${REROLL_LOGS_DIR:-/logs}/verifier"
mkdir -p "$LOGS"
REACHED="${REROLL_WORKSPACE:-/app}/agent-reached.json"
python3 - "$(dirname "$0")/probe.py" "$REACHED" "$LOGS/reward.json" <<'EOF'
import json, subprocess, sys
probe, reached, reward = sys.argv[1:]
items = json.loads(open(reached).read())
mine = subprocess.run([sys.executable, probe, "verifier"], capture_output=True, text=True)
items |= json.loads(mine.stdout)
open(reward, "w").write(json.dumps({"reward": 1, **items}))
EOF
"""
TASK_MD = """---
schema_version: '1.3'
name: url-denylist
agent:
  timeout_sec: 180
verifier:
  timeout_sec: 120
  env: {ENV}
sandbox:
  cpus: 1
  memory_mb: 1024
  network_mode: denylist
  blocked_urls: ['https://WEB/answers/']
  blocked_hosts: [DENIED]
oracle:
  env: {ENV}
---

## prompt

Nothing to do.
"""


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate of `WEB` (and ``www.`` `WEB`) signed by it: ``(ca.pem, leaf.pem,
    leaf.key)``, made with openssl."""
    folder.mkdir(parents=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=reroll test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        f"/CN={WEB}",
    )
    (folder / "leaf.ext").write_text(
        f"subjectAltName=DNS:{WEB},DNS:www.{WEB}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext")  # fmt: skip
    return folder / "ca.pem", folder / "leaf.pem", folder / "leaf.key"


def run_task(task: Path, jobs: Path, backend: str, names: dict[str, str], ca: Path) -> dict[str, Any]:
    """`reroll run TASK --agent oracle` with `names` resolved on the host and `ca` trusted there:
    its result.json, with its run folder under ``run_dir``."""
    bundle = jobs.parent / "host-bundle.pem"
    system = host_ca_bundle()
    bundle.write_bytes((system.read_bytes() if system else b"") + ca.read_bytes())
    env = naming(jobs.parent / "names", names) | {name: str(bundle) for name in HOST_CA_VARIABLES}
    command = [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", str(jobs)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = jobs.glob("*/*/result.json")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["run_dir"] = str(result_file.parent)
    return result


def test_the_agent_does_not_reach_a_blocked_url_by_any_way(sandbox_backend: str, tmp_path: Path) -> None:
    ca, leaf, key = certificates(tmp_path / "certs")
    with outside(SERVER, str(leaf), str(key)) as (first, second, port, seen):
        env = json.dumps({"WEB": WEB, "DENIED": DENIED, "PORT": str(port), "FIRST": first, "SECOND": second})
        text = TASK_MD.replace("WEB", WEB).replace("DENIED", DENIED).replace("{ENV}", env)
        scripts = {"solve": SOLVE, "test": TEST_SH, "probe": PROBE}
        task, checked = checked_task(tmp_path / "url-denylist", text, scripts)
        result = run_task(task, tmp_path / "jobs", sandbox_backend, {WEB: first, DENIED: second}, ca)
    assert f"URLs under https://{WEB}/answers" in checked, checked
    assert "blocked_urls" not in checked.split("ignored", 1)[-1], checked  # not "ignored"
    assert result["status"] == "ok", result.get("error")
    rewards = result["rewards"]
    blocked = ("https_blocked", "http_blocked", "https_disguised", "denied_host")
    assert {way: rewards[way] for way in blocked} == dict.fromkeys(blocked, 403.0), rewards
    assert (rewards["https_allowed"], rewards["http_allowed"]) == (200.0, 200.0), rewards
    # named by an address: refused before any connection (502 from the interceptor), or no answer
    assert rewards["http_by_address"] in (0.0, 502.0) and rewards["denied_by_address"] in (0.0, 502.0), (
        rewards
    )
    assert (rewards["direct_blocked"], rewards["unproxied_https"]) == (0.0, 0.0), rewards  # no way around
    assert rewards["verifier_direct"] == 200.0, rewards  # the verify phase is not held
    assert not [line for line in seen if "/answers/key" in line or second in line], seen
    assert {line.split()[1] for line in seen if "/public/page" in line} == {"http", "https"}, seen
    log = Path(result["run_dir"]) / "harness" / "url_denylist.jsonl"
    rules = {json.loads(line)["rule"] for line in log.read_text().splitlines()}
    assert {f"url:{WEB}/answers", f"host:{DENIED}"} <= rules, rules
