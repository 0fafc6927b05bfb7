"""Red team: the bundled tasks' verifiers do not trust an exit status that the agent's code controls.

The cheat replaces the module the verifier runs with ``import os; os._exit(0)``: a verifier that
imports it and rewards exit status 0 pays 1.0 (shown with fix-failing-test's former test.sh),
the bundled one pays 0: it reads the JUnit report of its hidden tests, which a run ended early
never writes. (The other bundled tasks compare the agent's output themselves.) Run on the local
sandbox, where fix-failing-test's verifier falls back to its unittest runner (no pytest on the
host) and reroll's own check of pytest's report does not apply: the task's verifier holds alone
(through the guard, `reroll_sidecar.guard`, when the sidecar runs as root).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REROLL = str(Path(sys.executable).parent / "reroll")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
EXIT_ZERO = "import os\nos._exit(0)\n"

EXIT_STATUS_TEST_SH = """#!/bin/sh
# fix-failing-test's former verifier: the hidden tests' exit status is the reward.
WORKSPACE="${REROLL_WORKSPACE:-/app}"
LOGS="${REROLL_LOGS_DIR:-/logs}"
mkdir -p "$LOGS/verifier"
cd "$WORKSPACE" || exit 1
if python3 "${REROLL_VERIFIER_DIR:-/verifier}/test_hidden.py"; then
  echo 1 > "$LOGS/verifier/reward.txt"
else
  echo 0 > "$LOGS/verifier/reward.txt"
fi
"""


def cheat_task(tmp_path: Path, example: str, module: str, solution: str) -> Path:
    """A copy of `example` whose oracle writes `module` as an early exit with status 0."""
    task = tmp_path / example
    shutil.copytree(EXAMPLES / example, task)
    cheat = f"#!/bin/sh\ncd \"${{REROLL_WORKSPACE:-/app}}\"\nprintf '{EXIT_ZERO}' > {module}\n"
    (task / solution / "solve.sh").write_text(cheat)
    return task


def reward_of(task: Path, tmp_path: Path) -> tuple[dict[str, float] | None, str]:
    args = ["run", str(task), "--agent", "oracle", "--sandbox", "local", "--jobs-dir", str(tmp_path / "jobs")]
    done = subprocess.run([REROLL, *args, "--job-name", "j"], capture_output=True, text=True, timeout=600)
    print(done.stdout, done.stderr, sep="\n")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result.get("error")
    output = "".join((run / "verifier" / n).read_text() for n in ("test-stdout.txt", "test-stderr.txt"))
    return result["rewards"], output


def test_an_early_exit_with_status_zero_scores_zero(tmp_path: Path) -> None:
    rewards, output = reward_of(cheat_task(tmp_path, "fix-failing-test", "calc.py", "oracle"), tmp_path)
    assert rewards == {"reward": 0.0}, output
    # unguarded: the runner wrote no report; guarded (reroll's sidecar as root): the guard's stream
    # never reached its end, and its report counts that as an error
    assert "no readable test report" in output or "ended before its session finished" in output, output


def test_the_former_exit_status_verifier_paid_the_cheat(tmp_path: Path) -> None:
    """The attack is real: the same cheat against fix-failing-test's former test.sh earns 1.0."""
    task = cheat_task(tmp_path, "fix-failing-test", "calc.py", "oracle")
    (task / "verifier" / "test.sh").write_text(EXIT_STATUS_TEST_SH)
    rewards, output = reward_of(task, tmp_path)
    assert rewards == {"reward": 1.0}, output
