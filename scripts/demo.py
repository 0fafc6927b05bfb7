#!/usr/bin/env python3
"""The main job on the embedded default, as `make demo` runs it.

1. `reroll run` records mini-swe-agent (installed unmodified from PyPI) on the bundled task
   `fix-failing-test` in the `local` sandbox, with the bundled scripted model as the live model.
   The scripted model answers turn 3 slowly, so the run hits its timeout there.
2. `reroll continue` replays the recorded exchanges (the agent re-executes its own steps), cuts
   over to the live model, finishes, and verifies.

Exits non-zero unless the continued run scores 1.0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = ROOT / "examples" / "tasks" / "fix-failing-test"


def reroll(*args: str) -> None:
    print(f"\n$ reroll {' '.join(args)}", flush=True)
    subprocess.run([REROLL, *args], check=True)


def only_run_folder(jobs: Path) -> Path:
    (folder,) = [p for p in jobs.iterdir() if p.is_dir()]
    return folder


def main() -> int:
    job = time.strftime("demo-%Y%m%d-%H%M%S")
    jobs_dir = ROOT / "jobs"
    started = time.monotonic()
    reroll(
        "run",
        str(TASK),
        "--agent",
        "mini-swe-agent",
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
    reroll("continue", str(original), "--timeout", "120")
    continued = only_run_folder(original.parent / "continued")
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    rewards = {}
    for label, folder in (("original", original), ("continued", continued)):
        result = json.loads((folder / "result.json").read_text())
        rewards[label] = (result.get("rewards") or {}).get("reward")
        print(f"{label:>9}: status={result['status']:<8} reward={rewards[label]}  {folder}")
    return 0 if rewards["continued"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
