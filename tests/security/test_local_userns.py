"""Red team, issue 19 items 1, 2 and 5 on the isolated `local` sandbox: an agent that hunts for the
hidden answer and plants a payload the verifier (root in the sandbox) imports.

Before the user namespace and the root view, on `local`: the agent found the task folder's
``verifier/`` through the host's root (reward 1.0 on a task no honest agent can solve), and the
payload ran as the host's root (``uid_map 0 0 4294967295``): it wrote into reroll's agents folder,
opened ``/proc/sys/kernel/core_pattern`` for writing, and saw the checkout, ``~/.gitconfig`` and
other runs' folders; with ``--network full`` the sandbox reached the host's loopback services
and other rollouts' proxies. Each is asserted to fail here, in one rollout (the attacks share
the task), with the probes' results printed by the verifier.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.cache import cache_dir
from reroll.sandbox.local import rootview
from reroll.sandbox.local.identity import SLOT_ID_START

from tests.e2e.test_reward_hacks import write_files

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]
REROLL = str(Path(sys.executable).parent / "reroll")
CHECKOUT = Path(__file__).resolve().parents[2]

HUNT = r"""
# Look everywhere for the hidden answer or the task's folder (the prompt's first line is in task.md).
MARK="$(head -n 1 "$REROLL_PROMPT_FILE")"
for f in $(find / -xdev \( -name secret.txt -o -name task.md \) 2>/dev/null); do
  echo "found $f" >> "$REROLL_WORKSPACE/hunt.txt"
  case "$f" in *secret.txt) cp "$f" "$REROLL_WORKSPACE/answer.txt" ;; esac
  case "$f" in *task.md) grep -q "$MARK" "$f" \
    && cp "$(dirname "$f")/verifier/secret.txt" "$REROLL_WORKSPACE/answer.txt" ;; esac
done
python3 - "$REROLL_WORKSPACE/net-agent.txt" <<'EOF'
import socket, sys
with open(sys.argv[1], "w") as out:
    for target in TARGETS:
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=3).close()
            out.write(f"{target} CONNECTED\n")
        except OSError as exc:
            out.write(f"{target} {exc}\n")
EOF
cat > "$REROLL_WORKSPACE/calc.py" <<'EOF'
PAYLOAD
EOF
echo "HUNTED"; cat "$REROLL_WORKSPACE/hunt.txt" "$REROLL_WORKSPACE/net-agent.txt" 2>/dev/null; exit 0
"""
PAYLOAD = r"""
import json, os, socket
report = {"uid_map": open("/proc/self/uid_map").read().split(), "uid": os.getuid()}
try:
    open("/proc/sys/kernel/core_pattern", "w").close()
    report["core_pattern"] = "opened for writing"
except OSError as exc:
    report["core_pattern"] = str(exc)
try:
    os.makedirs(AGENTS, exist_ok=True)
    with open(os.path.join(AGENTS, "poisoned-by-payload"), "w") as out:
        out.write("x")
    report["agents"] = "written"
except OSError as exc:
    report["agents"] = str(exc)
report["visible"] = [path for path in HOST_PATHS if os.path.exists(path)]
report["net"] = {}
for target in TARGETS:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        report["net"][target] = "CONNECTED"
    except OSError as exc:
        report["net"][target] = str(exc)
print("PAYLOAD:" + json.dumps(report))
"""
TEST_SH = """#!/bin/sh
cd "${REROLL_WORKSPACE:-/app}" || exit 1
python3 -c 'import calc' 2>&1
mkdir -p "$REROLL_LOGS_DIR/verifier"
if [ "$(cat answer.txt 2>/dev/null)" = "$(cat "${REROLL_VERIFIER_DIR:-/verifier}/secret.txt")" ]; then
  echo 1 > "$REROLL_LOGS_DIR/verifier/reward.txt"
else
  echo 0 > "$REROLL_LOGS_DIR/verifier/reward.txt"
fi
"""


@contextlib.contextmanager
def listener(host: str) -> Iterator[str]:
    """A TCP listener of the host on `host` (accepting and closing); yields ``host:port``."""
    server = socket.create_server((host, 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                server.accept()[0].close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{host}:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.fixture
def task_home() -> Iterator[Path]:
    """A folder for the task outside ``/tmp`` (which the old sandbox hid too), as a user's
    checkout of tasks is; removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="reroll-hunt-", dir="/var/tmp"))
    folder.chmod(0o755)  # readable by all, as a checkout of tasks is
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_hunting_agent_and_verifier_payload_reach_nothing_of_the_host(
    tmp_path: Path, task_home: Path
) -> None:
    secret = secrets.token_hex(16)
    mark = f"reroll-hunt-{secrets.token_hex(4)}"
    other_run = write_files(tmp_path / "other-jobs" / "run", {"harness/proxy.json": '{"token": "t"}'})
    agents = cache_dir() / "agents"
    host_paths = [str(CHECKOUT), str(other_run), str(task_home / "task"), str(Path.home() / ".gitconfig")]
    host_paths = [path for path in host_paths if Path(path).exists() or path.endswith("task")]
    with listener("127.0.0.1") as loopback, listener(f"127.{secrets.randbelow(200) + 20}.7.9") as other_proxy:
        targets = [loopback, other_proxy]
        payload = PAYLOAD.replace("AGENTS", repr(str(agents))).replace("HOST_PATHS", repr(host_paths))
        payload = payload.replace("TARGETS", repr(targets))
        hunt = HUNT.replace("TARGETS", repr(targets)).replace("PAYLOAD", payload)
        spec = {"hunter": {"description": "hunts the answer", "api_format": "openai-chat", "launch": hunt}}
        (tmp_path / "agents.yaml").write_text(json.dumps(spec))
        front = {"name": "secret", "verifier": {"timeout_sec": 120}}
        task = write_files(
            task_home / "task",
            {
                "task.md": f"---\n{json.dumps(front)}\n---\n{mark}\nWrite the secret into answer.txt.\n",
                "verifier/test.sh": TEST_SH,
                "verifier/secret.txt": secret,
            },
        )
        env = dict(
            os.environ,
            REROLL_AGENTS_FILE=str(tmp_path / "agents.yaml"),
            OPENAI_API_KEY="sk-unused",
            OPENAI_BASE_URL="http://127.0.0.1:9/v1",  # never called
        )
        argv = [REROLL, "run", str(task), "--agent", "hunter", "--model", "openai/gpt-test"]
        done = subprocess.run(
            [*argv, "--sandbox", "local", "--network", "full", "--jobs-dir", "jobs"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = (tmp_path / "jobs").glob("*/secret__*/result.json")
    result = json.loads(result_file.read_text())
    stdout = (result_file.parent / "verifier" / "test-stdout.txt").read_text()
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 0.0}), (result, stdout)
    (line,) = [line for line in stdout.splitlines() if line.startswith("PAYLOAD:")]  # it ran, as root
    report = json.loads(line.removeprefix("PAYLOAD:"))
    # the sandbox maps its root to a host range of its own; a verify runs in a user namespace of its own
    # inside that one (the sidecar's verify_ns), identity-mapped onto it, so it reads 0 0 65536:
    # never the host's full range (0 0 4294967295), and the checks below show it holds no host power
    inner, outer, count = report["uid_map"]
    assert report["uid"] == 0 and (inner, count) == ("0", "65536"), report
    assert outer == "0" or int(outer) >= SLOT_ID_START, report
    assert report["core_pattern"] != "opened for writing", report
    assert report["agents"] != "written" and not (agents / "poisoned-by-payload").exists(), report
    assert report["visible"] == [], report
    assert all(outcome != "CONNECTED" for outcome in report["net"].values()), report
    agent_output = (result_file.parent / "agent" / "output.log").read_text()
    assert "HUNTED" in agent_output, agent_output  # the agent ran its hunt and probes
    assert "secret.txt" not in agent_output and "CONNECTED" not in agent_output, agent_output
    assert all(f"{target} " in agent_output for target in targets), agent_output
