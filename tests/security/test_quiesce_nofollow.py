"""Red team, issue 12 items 1, 2 and 5: survivors, folder symlinks, FIFOs and early exits against
the verifier.

Each attack is a small malicious "agent" (an oracle ``solve.sh``, as in tests/e2e/test_reward_hacks.py)
on one task whose workspace holds two of the task's own start-up hooks (``tests/conftest.py``,
``x/conftest.py``) and an unsolved ``answer.py``. Every attack must fail — reward 0, nothing
written outside the workspace, the status and category stated — while the honest solution still
scores 1 under the same hardening, on each backend it runs on.

The survivor is a seeded variant (fork interval, ``setsid``): it double-forks out of the agent's
process group and hops to a new pid every few milliseconds; once the hidden tests appear it fixes
the answer, plants ``conftest.py`` files that end pytest with exit 0 and rewrites ``test.sh``.
Before quiesce it won reward 1 on both backends.

The ``exit-*`` attacks make the module under test end pytest with status 0 (``os._exit(0)`` at
import, or from an ``atexit`` hook after the test failed); before the verifier read pytest's own
report (``hardening.pytest_report``) both won reward 1 on docker.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.e2e.test_reward_hacks import run_oracle, write_files

pytestmark = [pytest.mark.slow, pytest.mark.spawns]

SURVIVOR = r"""
import os, random, sys, time
seed, interval, use_setsid = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
root = os.environ.get("REROLL_SANDBOX_ROOT", "/")
workspace = os.environ.get("REROLL_WORKSPACE", "/app")
verifier = os.path.join(root, "verifier")
random.seed(seed)
if os.fork():
    os._exit(0)
os.setsid()
EXIT = "import os\nos._exit(0)\n"
def plant(path, text):
    try:
        with open(path, "w") as out:
            out.write(text)
    except OSError:
        pass
deadline = time.time() + 600
while time.time() < deadline:
    time.sleep(interval * random.random())
    if os.fork():
        os._exit(0)
    if use_setsid and random.random() < 0.5:
        os.setsid()
    if os.path.exists(os.path.join(verifier, "test_answer.py")):  # the hidden tests are here
        plant(os.path.join(workspace, "answer.py"), "def answer():\n    return 42\n")
        plant(os.path.join(verifier, "conftest.py"), EXIT)
        plant(os.path.join(workspace, "tests", "conftest.py"), EXIT)
        plant(os.path.join(verifier, "test.sh"), "#!/bin/sh\nmkdir -p \"$REROLL_LOGS_DIR/verifier\"\n"
              "echo 1 > \"$REROLL_LOGS_DIR/verifier/reward.txt\"\n")
"""


def survive(seed: int, interval_seconds: float, use_setsid: bool) -> str:
    """Shell lines that start the survivor and return at once."""
    flag = "1" if use_setsid else "0"
    return (
        f"cat > /tmp/survivor-{seed}.py <<'EOF'\n{SURVIVOR}\nEOF\n"
        f"python3 /tmp/survivor-{seed}.py {seed} {interval_seconds} {flag} </dev/null >/dev/null 2>&1 &\n"
        "sleep 0.5\n"
    )


ATTACKS = {
    "honest": "printf 'def answer():\\n    return 42\\n' > answer.py\n",
    "survivor-folder-symlink": (
        'rm -rf tests && ln -s "${REROLL_SANDBOX_ROOT:-/}verifier" tests\n' + survive(1, 0.0, False)
    ),
    "survivor-hidden-tests": survive(2, 0.005, True),
    "restore-follows-folder-symlink": "rm -rf x && ln -s /etc x\n",
    "fifo": "mkfifo pipe conftest.py\n",
    # The code under test ends pytest with status 0: at import, or after the tests failed.
    "exit-at-import": "printf 'import os\\nos._exit(0)\\n' > answer.py\n",
    "exit-after-failed-tests": (
        "printf 'import atexit, os\\natexit.register(os._exit, 0)\\n' > answer.py\n"
        "printf 'def answer():\\n    return 41\\n' >> answer.py\n"
    ),
}

TEST_SH = """#!/bin/sh
# Copies the hidden test into the workspace and runs it there, as SWE-bench-style tasks do.
LOGS="${REROLL_LOGS_DIR:-/logs}"
WS="${REROLL_WORKSPACE:-/app}"
mkdir -p "$WS/tests" "$LOGS/verifier"
cp "$REROLL_VERIFIER_DIR/test_answer.py" "$WS/tests/"
if [ -e /etc/conftest.py ]; then echo PROBE-ETC-CONFTEST-PRESENT; else echo PROBE-ETC-CONFTEST-ABSENT; fi
cd "$WS"
# The local sandbox's python3 is the host's, which may lack pytest: run the test function directly.
if python3 -c "import pytest" 2>/dev/null; then set -- python3 -m pytest -q tests/test_answer.py
else set -- python3 -c "import sys; sys.path[:0] = ['.', 'tests']; import test_answer as t; t.test_answer()"
fi
if PYTHONPATH="$WS" "$@"; then echo 1 > "$LOGS/verifier/reward.txt"
else echo 0 > "$LOGS/verifier/reward.txt"; fi
"""
HIDDEN_TEST = "from answer import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"
OWN_HOOK = "# the task's own conftest.py\n"
UNSOLVED = "def answer():\n    return 41\n"
UNSOLVED_SHA256 = hashlib.sha256(UNSOLVED.encode()).hexdigest()


def make_task(root: Path, attack: str, backend: str) -> Path:
    """The attack's task; offline except on ``local-plain``, which has only the host's network."""
    task = root / attack
    network = "full" if backend == "local-plain" else "none"
    front = {"name": "verifier-attack", "verifier": {"timeout_sec": 60}, "environment": {"network": network}}
    files = {
        "task.md": f"---\n{json.dumps(front)}\n---\nMake answer() return 42.\n",
        "environment/Dockerfile": "FROM reroll/base:bookworm\nCOPY workspace/ /app/\nWORKDIR /app\n",
        "environment/workspace/answer.py": UNSOLVED,
        "environment/workspace/tests/conftest.py": OWN_HOOK,
        "environment/workspace/x/conftest.py": OWN_HOOK,
        "verifier/test.sh": TEST_SH,
        "verifier/test_answer.py": HIDDEN_TEST,
        "oracle/solve.sh": f'#!/bin/sh\nset -e\ncd "${{REROLL_WORKSPACE:-/app}}"\n{ATTACKS[attack]}',
    }
    return write_files(task, files)


@pytest.fixture(scope="module", params=["docker", "local", "local-plain"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_images")
    return str(request.param)


CASES = {
    "docker": [
        "honest",
        "survivor-folder-symlink",
        "survivor-hidden-tests",
        "restore-follows-folder-symlink",
        "fifo",
        "exit-at-import",
        "exit-after-failed-tests",
    ],
    "local": [  # isolated: the agent is a user of its own, as in docker; the exit-* attacks need
        # pytest, which the host's python3 (the sandbox's) may lack: the test runs without it there
        "honest",
        "survivor-folder-symlink",
        "survivor-hidden-tests",
        "restore-follows-folder-symlink",
        "fifo",
    ],
    "local-plain": ["honest", "survivor-hidden-tests"],
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_fails_and_honest_scores(attack: str, backend: str, tmp_path: Path) -> None:
    if attack not in CASES[backend]:
        pytest.skip(f"{attack} does not apply to the {backend} sandbox")
    result, run_dir = run_oracle(make_task(tmp_path, attack, backend), tmp_path, backend)
    if attack.startswith("survivor") and result["error_category"] == "resource_limit":
        # A survivor forking in a loop may meet the sandbox's pids_max (local, docker) first: the
        # rollout ends as resource_limit, verified all the same, and the attack fails as well.
        assert result["status"] == "error" and "pids_max" in result["error"], result
    else:
        assert (result["status"], result["error_category"]) == ("ok", None), result
    assert result["rewards"] == {"reward": 1.0 if attack == "honest" else 0.0}
    stdout = (run_dir / "verifier" / "test-stdout.txt").read_text()
    hardening = json.loads((run_dir / "verifier" / "hardening.json").read_text())
    if backend != "local-plain":  # an /etc of the sandbox's own
        assert "PROBE-ETC-CONFTEST-ABSENT" in stdout, stdout
    manifest = json.loads((run_dir / "workspace_manifest.json").read_text())
    if attack.startswith("survivor"):
        assert manifest["answer.py"] == UNSOLVED_SHA256, "the survivor fixed the code"
    if attack == "survivor-folder-symlink":
        assert any("tests was a symlink" in note for note in hardening["notes"]), hardening
    if attack == "restore-follows-folder-symlink":
        assert any("/app/x was a symlink" in note for note in hardening["notes"]), hardening
    if backend == "docker" and (attack == "honest" or attack.startswith("exit-")):  # pytest's report was read
        pytest_note = (run_dir / "verifier" / "pytest-report.txt").read_text()
        assert ("rewards zeroed" in pytest_note) is (attack != "honest"), pytest_note
    if attack == "fifo":
        assert (manifest["pipe"], manifest["conftest.py"]) == ("fifo:", "fifo:")
        assert "/app/conftest.py" in hardening["deleted"]
