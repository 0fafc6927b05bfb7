"""Benchmark: ``reroll branch --via snapshot`` against ``--via replay``, and the environment state's
snapshot + restore.

    .venv/bin/python scripts/bench/branch.py [--steps 40] [--at 10,30] [-n 8] [--concurrency 4]
        [--step-seconds 0] [--checkpoint-every 0] [--checkpoint-keep N] [--sandbox local] [--db-mb 100]
        [--without-pool]

Records one run of the resumable ``urllib-session`` agent (examples/agents/urllib-session.yaml)
on examples/tasks/sqlite-ledger (a SQLite state) with its scripted model: `--steps` bash steps,
each adding a row to the ledger (after sleeping `--step-seconds`, the tool time a real step
has), then done; with no flag (on ``local`` with copy-on-write it keeps a pool checkpoint at every
step by default, `reroll.rollout.extensions.checkpoints`; `--checkpoint-keep` N overrides the
retention, 0: none; with `--without-pool` once more with 0, branched by snapshot too: the path
before per-step pools), and with `--checkpoint-every`
> 0 once more with a checkpoint every that many steps. At each step of `--at` it is branched
into `-n` children (the same script: each child runs the remaining steps live): by replay (every
child re-executes the prefix), by snapshot from the run with no flag (from its kept pool
checkpoint of the step, or of the nearest earlier step with the remainder replayed; where it has
none, the prefix rebuilt once and its layers restored into each child), and by snapshot from the
checkpointed run. Prints, per branching, the wall time, the CPU-seconds (this process and every
descendant it waited for: proxies, model servers, sidecars, agents, tools; ``getrusage``) and the
fork latency (from the branch's start to the first child's first live request), and their ratios
to the replay's; then the per-step checkpoint cost of the recording (from its proxy's held
requests: the time each was held), and the seconds a snapshot and a restore of a `--db-mb` MB
SQLite database take in a sandbox. The pools are removed at the end. Exits 1 when a child did
not end ``ok``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import yaml
from reroll.agents import AGENTS_FILE_ENV
from reroll.environment.state import restore_state, snapshot_state
from reroll.jobs.branch import branch
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.commands.record import run_task
from reroll.rollout.lifecycle import sandbox_env
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.runfolder.run import HELD_FILE, TRAJECTORY, harness_folder
from reroll.runfolder.summary import BranchSummary, Via
from reroll.sandbox.base import create_sandbox
from reroll.sandbox.local.storage import remove_pools_under
from reroll.settings import RolloutSettings
from reroll.tasks.environment import StateSpec
from reroll.tasks.task import load_task
from reroll_contracts.trajectory import load_trajectory

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "tasks" / "sqlite-ledger"
AGENTS = ROOT / "examples" / "agents" / "urllib-session.yaml"
T = TypeVar("T")

FILL_DB = """
import os, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("create table blobs(id integer primary key, data blob)")
for _ in range(int(sys.argv[2])):
    db.execute("insert into blobs(data) values (?)", (os.urandom(1 << 20),))
db.commit()
"""
"""Fills a database (argument 1) with that many (argument 2) rows of 1 MiB random bytes."""


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and the descendants it waited for."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


async def measured(work: Callable[[], Awaitable[T]]) -> tuple[T, float, float]:
    """`work`'s result, wall seconds and CPU seconds."""
    wall, cpu = time.monotonic(), cpu_seconds()
    result = await work()
    return result, time.monotonic() - wall, cpu_seconds() - cpu


def script(folder: Path, steps: int, step_seconds: float) -> str:
    """A scripted model spec: the ledger's first `steps` steps (each sleeping `step_seconds`
    first), then done."""
    turns = yaml.safe_load((TASK / "scripted-model.yaml").read_text())["turns"]
    if steps > len(turns) - 1:
        raise SystemExit(f"--steps {steps}: the ledger's script has {len(turns) - 1}")
    mine = turns[:steps] + turns[-1:]
    if step_seconds:
        for turn in mine[:-1]:
            arguments = turn["tool_calls"][0]["arguments"]
            arguments["command"] = f"sleep {step_seconds} && {arguments['command']}"
    path = folder / "ledger.yaml"
    path.write_text(yaml.safe_dump({"turns": mine}))
    return f"scripted:{path}"


async def state_seconds(sandbox_name: str, megabytes: int) -> tuple[float, float, int]:
    """Seconds of a snapshot and of a restore of a `megabytes` MB SQLite database, and its size."""
    task = load_task(TASK)
    spec = StateSpec(kind="sqlite", paths=["/tmp/bench/big.db"])
    async with create_sandbox(sandbox_name, sandbox_spec(task), "bench-state") as sandbox:
        env = sandbox_env(sandbox)
        made = await sandbox.exec(["sh", "-c", "mkdir -p /tmp/bench"], env=env)
        filled = await sandbox.exec(["python3", "-c", FILL_DB, spec.paths[0], str(megabytes)], env=env)
        if made.exit_code or filled.exit_code:
            raise SystemExit(f"filling the database failed: {filled.output_text()}")
        started = time.monotonic()
        copy = await snapshot_state(sandbox, spec, env)
        snapshot = time.monotonic() - started
        started = time.monotonic()
        restored = await restore_state(sandbox, spec, copy.data, env)
        restore = time.monotonic() - started
        if restored != copy.digest:
            raise SystemExit("the restored database differs from its snapshot")
        return snapshot, restore, len(copy.data)


async def record(
    args: argparse.Namespace, folder: Path, model: str, every: int, keep: int | None = None
) -> tuple[Path, float]:
    """Record the ledger run (with a checkpoint every `every` steps; `keep`: its ``checkpoint_keep``
    [default: ``--checkpoint-keep``]); its run folder and wall seconds."""
    options = RolloutSettings(sandbox=args.sandbox, checkpoint_every=every)
    keep = args.checkpoint_keep if keep is None else keep
    if every or keep is not None:  # else reroll's default
        keep = 0 if every else keep
        options = options.model_copy(update={"checkpoint_keep": keep})
    jobs = folder / f"jobs-{every}-{keep}"
    outcome, wall, cpu = await measured(
        lambda: run_task(TASK, agent_name="urllib-session", model=model, options=options, jobs_dir=jobs)
    )
    if outcome.result.status != "ok":
        raise SystemExit(f"the recording ended {outcome.result.status}: {outcome.result.error}")
    checkpoints = f", a checkpoint every {every} steps" if every else ""
    print(f"  recorded{checkpoints} in {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
    held = Holds.of(outcome.run_dir)
    if held is not None and not every:
        print(f"  {held.line(wall)}", flush=True)
    return outcome.run_dir, wall


def first_live(summary: BranchSummary) -> tuple[float, str] | None:
    """The earliest live request of any child (``time.time()``) and that child's folder name."""
    firsts = []
    for child in summary.children:
        trajectory = Path(summary.parent) / child.folder / TRAJECTORY
        exchanges = load_trajectory(trajectory).exchanges if trajectory.is_file() else []
        live = [e for e in exchanges if e.metadata.source == "live"]
        if live:
            firsts.append((datetime.fromisoformat(live[0].request.timestamp).timestamp(), child.folder))
    return min(firsts) if firsts else None


def fork_latency(summary: BranchSummary, started: float) -> float | None:
    """Seconds from `started` (``time.time()``) to the first live request of any child."""
    first = first_live(summary)
    return first[0] - started if first else None


async def branched(
    args: argparse.Namespace, folder: Path, model: str, at: int, label: str, run: Path, via: Via
) -> Row:
    """Branch `run` at `at` into ``-n`` children `via`; its row."""
    print(f"branching at step {at} into {args.n} children {label}", flush=True)
    began = time.time()
    summary, wall, cpu = await measured(
        lambda: branch(
            run,
            at=at,
            models=[model],
            n=args.n,
            options=RolloutSettings(sandbox=args.sandbox),
            runner=RunnerOptions(concurrency=args.concurrency),
            output=folder / f"tree-{at}-{via}-{run.name}",
            via=via,
        )
    )
    latency = fork_latency(summary, began)
    statuses = [child.status for child in summary.children]
    print(f"  {wall:.1f} s wall, {cpu:.1f} CPU-s; children: {statuses}; {summary.note}", flush=True)
    for child in summary.children:
        if child.status != "ok":
            print(f"  child {child.folder} ended {child.status}: {child.error}", flush=True)
    return Row(at, label, wall, cpu, latency, summary)


@dataclass
class Row:
    """One branching: its step, how, wall and CPU seconds, fork latency and summary."""

    at: int
    label: str
    wall: float
    cpu: float
    latency: float | None
    summary: BranchSummary


@dataclass
class Holds:
    """Per-step checkpoint cost of a recording (`reroll.rollout.extensions.checkpoints.HELD_FILE`):
    how long the proxy held each step's request, and the controller's capture within it."""

    seconds: list[float]
    capture: list[float]

    @classmethod
    def of(cls, run: Path) -> Holds | None:
        """The holds of `run`, None when it held no request."""
        held = harness_folder(run) / HELD_FILE
        if not held.is_file():
            return None
        data = json.loads(held.read_text())
        return cls(list(data["seconds"]), list(data.get("capture", [])))

    def line(self, wall: float) -> str:
        """p50 and max of the holds, the capture's and the rest's p50 (the hold's round trips between
        proxy and controller), and the holds' sum against `wall` (the recording's seconds)."""
        p50 = statistics.median(self.seconds) * 1e3
        capture = statistics.median(self.capture) * 1e3 if self.capture else 0.0
        rest = statistics.median(s - c for s, c in zip(self.seconds, self.capture, strict=False)) * 1e3
        return (
            f"per-step checkpoint: {len(self.seconds)} steps held, p50 {p50:.1f} ms "
            f"(capture {capture:.1f} ms, proxy-controller round trips {rest:.1f} ms), "
            f"max {max(self.seconds) * 1e3:.1f} ms; held {sum(self.seconds):.2f} s = "
            f"{sum(self.seconds) / wall:.1%} of the recording's {wall:.1f} s wall"
        )


def table(rows: list[Row], args: argparse.Namespace) -> None:
    """Print the rows, each against the replay of its step."""
    print()
    print(
        f"| branch of {args.steps} steps, {args.n} children | wall s | CPU-s | fork latency s | "
        "wall / replay | CPU / replay |"
    )
    print("|---|---|---|---|---|---|")
    replays = {row.at: row for row in rows if row.summary.via == "replay"}
    for row in rows:
        base = replays[row.at]
        latency = f"{row.latency:.2f}" if row.latency is not None else "-"
        print(
            f"| K={row.at}, {row.label} | {row.wall:.1f} | {row.cpu:.1f} | {latency} | "
            f"{row.wall / base.wall:.2f}x | {row.cpu / base.cpu:.2f}x |"
        )


async def bench(args: argparse.Namespace, folder: Path) -> int:
    os.environ[AGENTS_FILE_ENV] = str(AGENTS)
    model = script(folder, args.steps, args.step_seconds)
    print(f"recording {args.steps} steps of urllib-session on sqlite-ledger ({args.sandbox})", flush=True)
    plain, plain_wall = await record(args, folder, model, 0)
    ways: list[tuple[str, Path, Via]] = [
        ("--via replay", plain, "replay"),
        ("--via snapshot (run with no flag)", plain, "snapshot"),
    ]
    if args.without_pool:  # the path before per-step pools: the prefix rebuilt, its layers restored
        bare, _ = await record(args, folder, model, 0, keep=0)
        ways.append(("--via snapshot (run with --checkpoint-keep 0)", bare, "snapshot"))
    if args.checkpoint_every:
        checkpointed, _ = await record(args, folder, model, args.checkpoint_every)
        ways.append(
            (f"--via snapshot (run --checkpoint-every {args.checkpoint_every})", checkpointed, "snapshot")
        )
    rows = [
        await branched(args, folder, model, int(at), label, run, via)
        for at in args.at.split(",")
        for label, run, via in ways
    ]
    table(rows, args)
    held = Holds.of(plain)
    if held is not None:
        print(f"\nthe run with no flag: {held.line(plain_wall)}")
    snapshot, restore, size = await state_seconds(args.sandbox, args.db_mb)
    print(
        f"\nSQLite state of {args.db_mb} MB ({size / 1e6:.0f} MB copied): "
        f"snapshot {snapshot:.2f} s, restore {restore:.2f} s"
    )
    remove_pools_under(folder)  # the recordings' and any rebuilt prefix's
    children = [child for row in rows for child in row.summary.children]
    return 0 if all(child.status == "ok" for child in children) else 1


def branch_arguments(concurrency: int) -> argparse.ArgumentParser:
    """The arguments of a branch bench (`--steps`, `--at`, `-n`, `--concurrency` defaulting to
    `concurrency`, `--step-seconds`), with the calling script's docstring as its description."""
    formatter = argparse.RawDescriptionHelpFormatter
    main_doc = sys.modules["__main__"].__doc__
    parser = argparse.ArgumentParser(description=main_doc, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--at", default="10,30", help="the steps to branch at, comma-separated")
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=concurrency)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    return parser


def main() -> int:
    parser = branch_arguments(concurrency=4)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument(
        "--checkpoint-keep",
        type=int,
        default=None,
        help="[default: reroll's]; 0: no pool checkpoint per step",
    )
    parser.add_argument("--sandbox", default="local")
    parser.add_argument(
        "--without-pool",
        action="store_true",
        help="also record with --checkpoint-keep 0 and branch by snapshot from it (no pool: before)",
    )
    parser.add_argument("--db-mb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reroll-bench-branch-") as folder:
        return asyncio.run(bench(args, Path(folder)))


if __name__ == "__main__":
    sys.exit(main())
