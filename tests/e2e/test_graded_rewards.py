"""BenchFlow's graded rewards end to end: a task in BenchFlow's native format (``task.md``,
``environment/``, ``oracle/``, ``verifier/`` with a ``verifier.md`` declaring the aggregate policy)
whose verifier writes a four-item weighted report (``metrics`` + ``aggregate``, no ``reward``) and
the same number in ``reward.txt``. The oracle scores 1.0 and a partial solver (two of four items)
0.4, what BenchFlow 0.7.11 computes from the same files, on each sandbox backend; result.json
records the items and the aggregate beside ``rewards``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REROLL = str(Path(sys.executable).parent / "reroll")
pytestmark = pytest.mark.slow

WEIGHTS = {"tests": 0.3, "lint": 0.3, "docs": 0.1, "style": 0.3}
TASK_MD = """---
schema_version: '1.3'
name: graded-report
agent:
  timeout_sec: 120
verifier:
  timeout_sec: 60
sandbox:
  network_mode: no-network
  cpus: 1
  memory_mb: 1024
---

## prompt

Create the files tests.ok, lint.ok, docs.ok and style.ok in the current directory.
"""
VERIFIER_MD = """---
verifier:
  default_strategy: script
  strategies:
    script:
      type: script
      command: ./test.sh
  outputs:
    aggregate_policy:
      method: weighted_mean
      criteria: [tests, lint, docs, style]
---

## verifier intent

One item per file the agent was asked to create.
"""
TEST_SH = """#!/bin/sh
# Four items, one per file; the report's aggregate says how they make one reward (no "reward" key),
# and reward.txt carries the same number, as a common test.sh writes both.
LOGS="${REROLL_LOGS_DIR:-/logs}/verifier"
mkdir -p "$LOGS"
cd "${REROLL_WORKSPACE:-/app}"
score() { if [ -f "$1.ok" ]; then echo 1.0; else echo 0.0; fi; }
T=$(score tests); L=$(score lint); D=$(score docs); S=$(score style)
ITEMS=$(printf '"tests": %s, "lint": %s, "docs": %s, "style": %s' "$T" "$L" "$D" "$S")
AGGREGATE='{"method": "weighted_mean", "weights": WEIGHTS}'
printf '{"metrics": {%s},\\n "aggregate": %s}\\n' "$ITEMS" "$AGGREGATE" > "$LOGS/reward.json"
awk -v t="$T" -v l="$L" -v d="$D" -v s="$S" \\
  'BEGIN { print 0.3 * t + 0.3 * l + 0.1 * d + 0.3 * s }' > "$LOGS/reward.txt"
""".replace("WEIGHTS", json.dumps(WEIGHTS))


def make_task(root: Path, creates: list[str]) -> Path:
    """The task folder, its oracle creating `creates` (of tests, lint, docs, style)."""
    files = {
        "task.md": TASK_MD,
        "environment/Dockerfile": "FROM debian:trixie-slim\nWORKDIR /app\n",
        "oracle/solve.sh": "#!/bin/sh\n" + "".join(f"touch {name}.ok\n" for name in creates),
        "verifier/test.sh": TEST_SH,
        "verifier/verifier.md": VERIFIER_MD,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run(task: Path, jobs: Path, backend: str) -> tuple[dict[str, Any], Path]:
    """`reroll run TASK --agent oracle`; its result.json and run folder."""
    done = subprocess.run(
        [REROLL, "run", str(task), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", str(jobs)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(done.stdout, done.stderr, sep="\n")
    (result_file,) = jobs.glob("*/*/result.json")
    return json.loads(result_file.read_text()), result_file.parent


@pytest.mark.parametrize(
    ("creates", "expected"),
    [(["tests", "lint", "docs", "style"], 1.0), (["tests", "docs"], 0.4)],
    ids=["oracle", "partial"],
)
def test_a_weighted_report_scores_what_benchflow_computes(
    creates: list[str], expected: float, sandbox_backend: str, tmp_path: Path
) -> None:
    task = make_task(tmp_path / "graded-report", creates)
    result, folder = run(task, tmp_path / "jobs", sandbox_backend)
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"]["reward"] == pytest.approx(expected, abs=1e-9)
    graded = result["verify_result"]
    assert graded["items"] == {name: 1.0 if name in creates else 0.0 for name in WEIGHTS}
    assert graded["aggregate"]["method"] == "weighted_mean"
    assert graded["aggregate"]["weights"] == WEIGHTS
    assert graded["aggregate"]["value"] == pytest.approx(expected, abs=1e-9)
    assert json.loads((folder / "verifier" / "reward.json").read_text())["aggregate"]["weights"] == WEIGHTS
