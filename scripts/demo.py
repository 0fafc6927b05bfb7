#!/usr/bin/env python3
"""The main job on the embedded default, as `make demo` runs it.

1. `reroll run` records the agent (`--agent NAME`, default mini-swe-agent; installed unmodified
   from PyPI) on the bundled task `fix-failing-test` in the sandbox (`--sandbox`, default
   `local`), with the bundled scripted model as the live model (the task's script for that
   agent). The scripted model answers turn 3 slowly, so the run hits its timeout there.
2. `reroll continue` replays the recorded exchanges (the agent re-executes its own steps), cuts
   over to the live model, finishes, and verifies.
3. `reroll replay` rebuilds the recorded run by replay only and compares it step by step.

Exits non-zero unless the continued run scores 1.0 and the replay is faithful (every step
matched, the same workspace). `make demo AGENT=NAME SANDBOX=NAME` passes both flags.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = ROOT / "examples" / "tasks" / "fix-failing-test"


def reroll(*args: str, check: bool = True) -> int:
    print(f"\n$ reroll {' '.join(args)}", flush=True)
    return subprocess.run([REROLL, *args], check=check).returncode


def only_run_folder(jobs: Path) -> Path:
    (folder,) = [p for p in jobs.iterdir() if p.is_dir()]
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="mini-swe-agent", help="the agent (see `reroll agents`)")
    parser.add_argument("--sandbox", default="local", help="the sandbox backend")
    args = parser.parse_args(argv)
    job = time.strftime(f"demo-{args.agent}-{args.sandbox}-%Y%m%d-%H%M%S")
    jobs_dir = ROOT / "jobs"
    started = time.monotonic()
    reroll(
        "run",
        str(TASK),
        "--agent",
        args.agent,
        "--sandbox",
        args.sandbox,
        "--model",
        "scripted",
        "--timeout",
        "15",
        "--jobs-dir",
        str(jobs_dir),
        "--job-name",
        job,
    )
    original = only_run_folder(jobs_dir / job)
    reroll("continue", str(original), "--timeout", "120", "--sandbox", args.sandbox)
    continued = only_run_folder(original.parent / "continued")
    faithful = reroll("replay", str(original), "--sandbox", args.sandbox, check=False) == 0
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    rewards = {}
    for label, folder in (("original", original), ("continued", continued)):
        result = json.loads((folder / "result.json").read_text())
        rewards[label] = (result.get("rewards") or {}).get("reward")
        print(f"{label:>9}: status={result['status']:<8} reward={rewards[label]}  {folder}")
    print(f"   replay: {'faithful' if faithful else 'NOT faithful'}")
    return 0 if rewards["continued"] == 1.0 and faithful else 1


if __name__ == "__main__":
    sys.exit(main())
