#!/usr/bin/env python3
"""The main job on the embedded default, as `make demo` runs it.

1. `reroll run` records the agent (`--agent NAME`, default mini-swe-agent; installed unmodified
   from PyPI) on the bundled task `fix-failing-test` in the sandbox (`--sandbox`, default
   `local`), with the bundled scripted model as the live model: a copy of the task's script for
   that agent whose marked turn (its `delay_seconds`) never comes in time, so the run hits its
   timeout there, whatever the agent's start-up takes (`--timeout`: a default per agent, ample
   for its start-up; on a machine so loaded that the agent did not reach the model in time, the
   recording is made again with twice the timeout, up to `RECORD_TRIES` times in all).
2. `reroll continue` replays the recorded exchanges (the agent re-executes its own steps), cuts
   over to the live model (the task's own script), finishes, and verifies.
3. `reroll replay` rebuilds the recorded run by replay only and compares it step by step.

Exits non-zero unless the recording holds an exchange, the continued run scores 1.0 and the
replay is faithful (every step matched, the same workspace). `make demo AGENT=NAME
SANDBOX=NAME` passes both flags.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml
from reroll.models.spec import task_script

ROOT = Path(__file__).resolve().parent.parent
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = ROOT / "examples" / "tasks" / "fix-failing-test"


def reroll(*args: str, check: bool = True) -> int:
    print(f"\n$ reroll {' '.join(args)}", flush=True)
    return subprocess.run([REROLL, *args], check=check).returncode


def only_run_folder(jobs: Path) -> Path:
    (folder,) = [p for p in jobs.iterdir() if p.is_dir()]
    return folder


RECORD_TIMEOUT_SECONDS = {
    "mini-swe-agent": 30.0,
    "claude-code": 40.0,
    "codex": 40.0,
    "aider": 90.0,
    "openhands": 120.0,
}
"""How long the recording runs by default: the agent's start-up on a loaded machine and its
first turns (OpenHands takes 20 to 60 s to start, aider 5 to 15 s); other agents get 60 s."""
RECORD_TRIES = 3
"""Recordings made at most, each with twice the previous timeout, until one holds an exchange."""
STALL_SECONDS = 3600
"""The marked turn's delay in the recording's script: the timeout always comes first."""
FOLLOW_UP_TIMEOUT = "300"
"""The timeout of `continue` and `replay` (seconds): the agent starts again in each."""


def stalled_script(agent: str, path: Path) -> Path:
    """Write to `path` the task's script for `agent` with its marked turn (the one that has a
    ``delay_seconds``) stalled for `STALL_SECONDS`; returns `path`."""
    script = yaml.safe_load(task_script(TASK, agent).read_text())
    slow = [turn for turn in script["turns"] if "delay_seconds" in turn]
    if not slow:
        raise SystemExit(f"{task_script(TASK, agent)}: no turn with delay_seconds to stall the recording at")
    slow[0]["delay_seconds"] = STALL_SECONDS
    path.write_text(yaml.safe_dump(script, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="mini-swe-agent", help="the agent (see `reroll agents`)")
    parser.add_argument("--sandbox", default="local", help="the sandbox backend")
    parser.add_argument(
        "--timeout", type=float, help="the recording's timeout, seconds [default: per agent, else 60]"
    )
    args = parser.parse_args(argv)
    job = time.strftime(f"demo-{args.agent}-{args.sandbox}-%Y%m%d-%H%M%S")
    jobs_dir = ROOT / "jobs"
    jobs_dir.mkdir(exist_ok=True)
    script = stalled_script(args.agent, jobs_dir / f"{job}.stalled-script.yaml")
    timeout = args.timeout or RECORD_TIMEOUT_SECONDS.get(args.agent, 60.0)
    started = time.monotonic()
    original, recorded = record(args, script, jobs_dir, job, timeout)
    reroll(
        "continue",
        str(original),
        "--model",
        "scripted",
        "--timeout",
        FOLLOW_UP_TIMEOUT,
        "--sandbox",
        args.sandbox,
    )
    continued = only_run_folder(original.parent / "continued")
    replayed = reroll(
        "replay", str(original), "--timeout", FOLLOW_UP_TIMEOUT, "--sandbox", args.sandbox, check=False
    )
    faithful = replayed == 0
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    rewards = {}
    for label, folder in (("original", original), ("continued", continued)):
        result = json.loads((folder / "result.json").read_text())
        rewards[label] = (result.get("rewards") or {}).get("reward")
        print(f"{label:>9}: status={result['status']:<8} reward={rewards[label]}  {folder}")
    print(f"   replay: {'faithful' if faithful else 'NOT faithful'}")
    return 0 if rewards["continued"] == 1.0 and faithful and recorded else 1


def record(
    args: argparse.Namespace, script: Path, jobs_dir: Path, job: str, timeout: float
) -> tuple[Path, int]:
    """`reroll run` of the stalled `script` into ``jobs_dir/job[-try-N]``, again with twice the
    timeout while the recording holds no exchange (`RECORD_TRIES`); the last run folder and its
    exchanges."""
    for attempt in range(RECORD_TRIES):
        name = job if attempt == 0 else f"{job}-try-{attempt + 1}"
        reroll(
            "run", str(TASK), "--agent", args.agent, "--sandbox", args.sandbox,
            "--model", f"scripted:{script}", "--timeout", f"{timeout:g}",
            "--jobs-dir", str(jobs_dir), "--job-name", name,
        )  # fmt: skip
        original = only_run_folder(jobs_dir / name)
        recorded = int(json.loads((original / "result.json").read_text())["counts"]["exchanges"])
        if recorded:
            break
        print(f"\nthe recording holds no exchange: {args.agent} did not reach the model within {timeout:g} s")
        timeout *= 2
    return original, recorded


if __name__ == "__main__":
    sys.exit(main())
