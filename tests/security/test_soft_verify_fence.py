"""Red team: a soft verify between the rounds of a trial must leave nothing a later round can use.

The task's answer is a random secret only its verifier holds. Round 1's "agent" (the oracle
agent running the task's solve.sh) plants an import-time payload in ``calc.py``; the soft verify
after round 1 imports it as root, with the hidden tests at hand. The payload copies the verifier
folder into the agent's HOME, ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the workspace, and leaves
a daemon (double fork, new session) that keeps writing the secret where the agent can read it.
Round 2's agent looks for all of it: it must find nothing, and the final reward must stay 0 —
while the payload did run (its mark is in round 1's verifier output).
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

PAYLOAD = r'''
import os, shutil, subprocess
_verifier = os.environ.get("REROLL_VERIFIER_DIR", "/verifier")
if os.path.isdir(_verifier) and os.geteuid() == 0:
    print("PAYLOAD RAN AS ROOT", flush=True)
    _workspace = os.environ.get("REROLL_WORKSPACE", "/app")
    for _where in ("/home/agent", "/tmp", "/var/tmp", "/dev/shm", _workspace):
        _copy = os.path.join(_where, "stolen-verifier")
        shutil.copytree(_verifier, _copy, dirs_exist_ok=True)
        os.system(f"chmod -R a+rwX {_copy}")
    _secret = open(os.path.join(_verifier, "secret.txt")).read().strip()
    _daemon = f"""
sleep 2
while true; do
  for f in /tmp/late-secret /home/agent/late-secret {_workspace}/answer.txt; do
    echo {_secret} > $f 2>/dev/null; chmod 666 $f 2>/dev/null
  done
  sleep 0.2
done
"""
    subprocess.Popen(["setsid", "sh", "-c", f"sh -c '{_daemon}' >/dev/null 2>&1 &"])


def mean(values):
    return sum(values) / len(values)
'''

SOLVE = r"""#!/bin/sh
cd "${REROLL_WORKSPACE:-/app}"
if [ ! -f .round1-done ]; then
  cat > calc.py <<'EOF'
@PAYLOAD@
EOF
  touch .round1-done
  exit 0
fi
sleep 4  # the daemon, were it alive, has written the secret by now
found=$(grep -rls SECRET-MARK "$HOME" /tmp /var/tmp /dev/shm . 2>/dev/null)
[ -n "$found" ] && echo "FOUND: $found"
for f in $found; do
  grep -ho 'SECRET-MARK-[0-9a-f]*' "$f" | head -n 1 > answer.txt
done
[ -z "$found" ] && echo "FOUND NOTHING"
ls -la . "$HOME" /tmp
exit 0
""".replace("@PAYLOAD@", PAYLOAD.strip())

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


def make_trial(root: Path, solve: str = SOLVE) -> Path:
    """A two-round trial of a task whose answer (a random secret) only its verifier holds,
    its oracle running `solve`."""
    secret = f"SECRET-MARK-{secrets.token_hex(16)}"
    task = root / "secret-task"
    files = {
        "task.md": '---\n{"name": "secret-task", "verifier": {"timeout_sec": 60}, '
        '"environment": {"network": "none"}}\n---\nWrite the secret into answer.txt.\n',
        "environment/Dockerfile": "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n",
        "environment/workspace/calc.py": "def mean(values):\n    return sum(values) / len(values)\n",
        "verifier/test.sh": TEST_SH,
        "verifier/secret.txt": secret + "\n",
        "oracle/solve.sh": solve,
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


def run_trial(trial: Path, sandbox_backend: str, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """Run `trial` with the oracle agent on `sandbox_backend`; its run folder and result.json."""
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
    return run, json.loads((run / "result.json").read_text())


def test_round_two_finds_nothing_the_soft_verify_ran(sandbox_backend: str, tmp_path: Path) -> None:
    run, result = run_trial(make_trial(tmp_path), sandbox_backend, tmp_path)
    record = json.loads((run / "trial.json").read_text())
    soft = run / "verifier" / "rounds" / "0"
    assert "PAYLOAD RAN AS ROOT" in (soft / "test-stdout.txt").read_text(), "the attack did not run"
    assert record["turns"][0]["rewards"] == {"reward": 0.0}
    cleanup = (soft / "cleanup.txt").read_text()
    killed = int(cleanup.split("soft verify fence: ", 1)[1].split(" processes killed", 1)[0])
    own_namespaces = "namespaces of its own" in cleanup  # then the daemon died with its PID namespace
    assert (killed >= 1 or own_namespaces) and "the agent's folders restored" in cleanup, cleanup
    agent_output = "".join(p.read_text(errors="replace") for p in (run / "agent").rglob("*") if p.is_file())
    assert "FOUND NOTHING" in agent_output and "FOUND:" not in agent_output, agent_output[-3000:]
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 0.0}
