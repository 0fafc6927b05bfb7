"""Benchmark: what a verify's guard and own namespaces cost (issue 32).

    sudo .venv/bin/python scripts/bench/verify_guard.py [-n 20] [--e2e BACKEND]

Run as root on the host (the guard switches user). Prints the median wall time, in milliseconds,
over `-n` runs of:

1. ``sh -c true`` plainly and through ``reroll-sidecar ns-exec`` (the test script's fresh user,
   mount, PID, IPC and UTS namespaces and its keyring filter; with ``--fresh-tmp``, a soft
   verify's own /tmp too; with ``--own-net``, a verifier stricter than the agent: its own
   loopback-only network namespace, the sandbox's loopback ports relayed into it);
2. in-process pieces, in a forked child each: the keyring lock-down alone (a fresh session
   keyring and the seccomp filter), the guard's clean-up scan (`guard.kill_user`, nothing to
   kill), and making, writing and removing a run's canary modules;
3. fix-failing-test's hidden tests (with the host's python3) by the task's own unittest runner,
   unguarded, the same with a run's canary modules beside them (what running the canaries
   costs), and through ``reroll-sidecar guard`` (the child as the guard's user, the canaries,
   the pipe, the report);

with ``--baseline DIR`` the guarded run once more with the sidecar package found in DIR (another
commit's, e.g. ``git archive main sidecar/reroll_sidecar | tar -x -C /tmp/base`` then
``--baseline /tmp/base/sidecar``), alternating run by run with this tree's;
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
from collections.abc import Callable
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


def median_call_ms(call: Callable[[], object], runs: int) -> float:
    """The median wall time of `call` in a fresh forked child (`runs` times), in milliseconds."""
    times = []
    for _ in range(runs):
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            start = time.perf_counter()
            call()
            os.write(write, str((time.perf_counter() - start) * 1000).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as handle:
            times.append(float(handle.read() or "nan"))
        os.waitpid(child, 0)
    return statistics.median(times)


def pieces(runs: int, tests: Path) -> str:
    """Step 2 of the module docstring, as one line."""
    from reroll_sidecar import guard, verify_ns
    from reroll_sidecar.guard_canaries import Canaries

    def canaries() -> None:
        made = Canaries.fresh(str(tests / "test_hidden.py"), str(tests))
        made.write(str(tests), str(tests))
        made.remove()

    keys = median_call_ms(verify_ns._no_keyrings, runs)
    scan = median_call_ms(lambda: guard.kill_user(guard.GUARD_UID), runs)
    made = median_call_ms(canaries, runs)
    return (
        f"keyring lock-down {keys:.2f} ms, clean-up scan {scan:.2f} ms,"
        f" canaries made+written+removed {made:.2f} ms"
    )


def e2e_seconds(backend: str) -> float:
    """verifier_seconds of one oracle run of fix-failing-test on `backend`."""
    with tempfile.TemporaryDirectory() as jobs:
        reroll = str(Path(sys.executable).parent / "reroll")
        args = ["run", str(TASK), "--agent", "oracle", "--sandbox", backend, "--jobs-dir", jobs]
        subprocess.run([reroll, *args, "--job-name", "b"], capture_output=True, check=True, timeout=900)
        (run,) = (Path(jobs) / "b").iterdir()
        return float(json.loads((run / "result.json").read_text())["timings"]["verifier_seconds"])


def canary_files(tests: Path) -> None:
    """A run's canary modules written beside the hidden tests (left there: the folder is temporary)."""
    from reroll_sidecar.guard_canaries import Canaries

    Canaries.fresh(str(tests / "test_hidden.py"), str(tests)).write(str(tests), str(tests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="runs per figure [20]")
    parser.add_argument("--baseline", help="a folder holding another reroll_sidecar package to compare")
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
    net = median_ms([*SIDECAR, "ns-exec", "--own-net", "--", "sh", "-c", "true"], options.n)
    print(
        f"sh -c true: plain {plain:.1f} ms, ns-exec {ns:.1f} ms, ns-exec --fresh-tmp {fresh:.1f} ms,"
        f" ns-exec --own-net {net:.1f} ms"
        f" (of which the launcher's interpreter start, measured alone: {start:.1f} ms)"
    )
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        tests, workspace = Path(folder) / "verifier", Path(folder) / "workspace"
        shutil.copytree(TASK / "verifier", tests)
        shutil.copytree(TASK / "environment" / "workspace", workspace)
        env = {**os.environ, "REROLL_WORKSPACE": str(workspace), "PYTHONDONTWRITEBYTECODE": "1"}
        report = str(Path(folder) / "junit.xml")
        print(pieces(options.n, tests))
        runner = ["python3", "run_unittest.py", report, "test_hidden.py"]
        unguarded = median_ms(runner, options.n, str(tests), env)
        canary_files(tests)  # the task's runner discovers them by its pattern
        with_canaries = median_ms([*runner[:3], "test_*.py"], options.n, str(tests), env)
        guard = [*SIDECAR, "guard", "--junitxml", report, "--", "test_hidden.py"]
        base_env = {**env, "PYTHONPATH": options.baseline} if options.baseline else None
        cwd = str(tests)
        pairs = [  # alternating, so both see the same load
            (median_ms(guard, 1, cwd, env), median_ms(guard, 1, cwd, base_env) if base_env else 0.0)
            for _ in range(options.n)
        ]
        guarded, baseline = (statistics.median(side) for side in zip(*pairs, strict=True))
    print(
        f"fix-failing-test's hidden tests: unguarded {unguarded:.1f} ms, with a run's canaries"
        f" {with_canaries:.1f} ms, guarded {guarded:.1f} ms"
        + (f", guarded by the baseline's sidecar {baseline:.1f} ms" if base_env else "")
    )
    if options.e2e:
        print(f"end to end on {options.e2e}: verifier_seconds {e2e_seconds(options.e2e):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
