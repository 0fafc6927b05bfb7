#!/usr/bin/env python3
# Run with the project's interpreter: .venv/bin/python scripts/bench/pytest_plugin_scan.py [--calls N]
"""What the pytest-plugin scan adds to verification: it runs twice per rollout (PrepareVerify and
Verify), each time one ``python3 -I`` that lists the site directories (which PrepareVerify ran
before anyway, for the start-up hooks) and now also reads every distribution's entry points and
checks the owners and modes of the plugins' files.

Times, N times each (default 20), in this process: `reroll_sidecar.pytest_plugins.scan` with the
python3 of the project's venv (its pytest plugins: anyio, asyncio, hypothesis, timeout, xdist)
against the bare start of that interpreter (``python3 -I -c pass``), and prints the p50s, their
difference and ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reroll_sidecar import pytest_plugins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="runs of each (default 20)")
    calls = parser.parse_args().calls
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    found = asyncio.run(pytest_plugins.scan(env))
    print(f"python3: {bin_dir}/python3; trusted pytest plugins: {', '.join(sorted(found.trusted))}")

    bare: list[float] = []
    scans: list[float] = []
    for _ in range(calls):  # interleaved, so that a slow spell of the machine hits both
        started = time.perf_counter()
        subprocess.run(["python3", "-I", "-c", "pass"], env=env, check=True)
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        asyncio.run(pytest_plugins.scan(env))
        scans.append(time.perf_counter() - started)
    bare_ms, scan_ms = statistics.median(bare) * 1000, statistics.median(scans) * 1000
    print(f"python3 -I -c pass   p50 {bare_ms:8.1f} ms   ({calls} runs)")
    print(f"plugin scan          p50 {scan_ms:8.1f} ms   ({calls} runs)")
    print(f"scan - bare start    {scan_ms - bare_ms:8.1f} ms   ratio {scan_ms / bare_ms:.2f}")


if __name__ == "__main__":
    main()
