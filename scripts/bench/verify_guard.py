"""Benchmark: what a verify's guard and own namespaces cost (issue 32).

    sudo .venv/bin/python scripts/bench/verify_guard.py [-n 20] [--e2e BACKEND]

Run as root on the host (the guard switches user). Prints the median wall time, in milliseconds,
over `-n` runs of:

1. ``sh -c true`` plainly and through ``reroll-sidecar ns-exec`` (the test script's fresh user,
   mount, PID, IPC and UTS namespaces; with ``--fresh-tmp``, a soft verify's own /tmp too);
2. fix-failing-test's hidden tests (with the host's python3) by the task's own unittest runner,
   unguarded, and through ``reroll-sidecar guard`` (the child as the guard's user, the canaries,
   the pipe, the report);

and with ``--e2e BACKEND`` (local or docker) the ``verifier_seconds`` of one
``reroll run examples/tasks/fix-failing-test --agent oracle`` (the verify as shipped: guarded,
in its own namespaces) for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = [sys.executable, "-m", "reroll_sidecar"]
TASK = ROOT / "examples" / "tasks" / "fix-failing-test"


def median_ms(argv: list[str], runs: int, cwd: str | None = None, env: dict[str, str] | None = None) -> float:
    """The median wall time of `runs` runs of `argv`, in milliseconds (a failed start raises)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
        times.append((time.perf_counter() - start) * 1000)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return statistics.median(times)


def e2e_seconds(backend: str) -> float:
    """verifier_seconds of one oracle run of fix-failing-test on `backend`."""
    with tempfile.TemporaryDirectory() as jobs:
        reroll = str(Path(sys.executable).parent / "reroll")
        args = ["run", str(TASK), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", jobs]
        subprocess.run([reroll, *args, "--job-name", "b"], capture_output=True, check=True, timeout=900)
        (run,) = (Path(jobs) / "b").iterdir()
        return float(json.loads((run / "result.json").read_text())["timings"]["verifier_seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="runs per figure [20]")
    parser.add_argument(
        "--e2e", choices=["local", "docker"], help="also one end-to-end verify on this backend"
    )
    options = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the guard switches user")
    plain = median_ms(["sh", "-c", "true"], options.n)
    start = median_ms(
        [sys.executable, "-c", "import reroll_sidecar.__main__, reroll_sidecar.verify_ns"], options.n
    )
    ns = median_ms([*SIDECAR, "ns-exec", "--", "sh", "-c", "true"], options.n)
    fresh = median_ms([*SIDECAR, "ns-exec", "--fresh-tmp", "--", "sh", "-c", "true"], options.n)
    print(
        f"sh -c true: plain {plain:.1f} ms, ns-exec {ns:.1f} ms, ns-exec --fresh-tmp {fresh:.1f} ms"
        f" (of which the launcher's interpreter start, measured alone: {start:.1f} ms)"
    )
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        tests, workspace = Path(folder) / "verifier", Path(folder) / "workspace"
        shutil.copytree(TASK / "verifier", tests)
        shutil.copytree(TASK / "environment" / "workspace", workspace)
        env = {**os.environ, "REROLL_WORKSPACE": str(workspace), "PYTHONDONTWRITEBYTECODE": "1"}
        report = str(Path(folder) / "junit.xml")
        unguarded = median_ms(
            ["python3", "run_unittest.py", report, "test_hidden.py"], options.n, str(tests), env
        )
        guarded = median_ms(
            [*SIDECAR, "guard", "--junitxml", report, "--", "test_hidden.py"], options.n, str(tests), env
        )
    print(f"fix-failing-test's hidden tests: unguarded {unguarded:.1f} ms, guarded {guarded:.1f} ms")
    if options.e2e:
        print(f"end to end on {options.e2e}: verifier_seconds {e2e_seconds(options.e2e):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
