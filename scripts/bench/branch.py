"""Benchmark: ``reroll branch --via snapshot`` against ``--via replay``, and the environment state's
snapshot + restore.

    .venv/bin/python scripts/bench/branch.py [--steps 40] [--at 30] [-n 8] [--concurrency 4]
        [--step-seconds 0] [--checkpoint-every 10] [--sandbox local] [--db-mb 100] [--keep-snapshots]

Records one run of the resumable ``urllib-session`` agent (examples/agents/urllib-session.yaml)
on examples/tasks/sqlite-ledger (a SQLite state) with its scripted model: `--steps` bash steps,
each adding a row to the ledger (after sleeping `--step-seconds`, the tool time a real step
has), then done; once plainly, once with a checkpoint every `--checkpoint-every` steps. It is
branched at step `--at` into `-n` children (the same script: each child runs the remaining
steps live): by replay (every child re-executes the prefix), by snapshot from the plain run (the
prefix rebuilt once, its layers captured and restored into each child) and by snapshot from the
checkpointed run (its recorded checkpoint restored into each child, no prefix re-executed; with
`--keep-snapshots`, local only, that run keeps a copy-on-write pool and the children start from
its snapshot of the step, restoring only the environment's layer; the pool is removed at the end).
Prints wall time and CPU-seconds (this process and every descendant it waited for: proxies,
model servers, sidecars, agents, tools; ``getrusage``) of each, and their ratios; then the
seconds a snapshot and a restore of a `--db-mb` MB SQLite database take in a sandbox. Exits 1
when a child did not end ``ok``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import yaml
from reroll.agents import AGENTS_FILE_ENV
from reroll.environment.state import restore_state, snapshot_state
from reroll.jobs.branch import Via, branch
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.commands.record import run_task
from reroll.rollout.extensions.checkpoints import CHECKPOINTS_DIR, pool_reference
from reroll.rollout.lifecycle import sandbox_env
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.runfolder.summary import BranchSummary
from reroll.sandbox.base import create_sandbox
from reroll.sandbox.docker import disk
from reroll.sandbox.local.storage import PoolSnapshot
from reroll.settings import RolloutSettings
from reroll.tasks.environment import StateSpec
from reroll.tasks.task import load_task

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


async def record(args: argparse.Namespace, folder: Path, model: str, every: int) -> Path:
    """Record the ledger run (with a checkpoint every `every` steps); its run folder."""
    kept = {"keep_snapshots": True} if every and args.keep_snapshots else None
    options = RolloutSettings(sandbox=args.sandbox, checkpoint_every=every, sandbox_config=kept)
    jobs = folder / f"jobs-{every}"
    outcome, wall, cpu = await measured(
        lambda: run_task(TASK, agent_name="urllib-session", model=model, options=options, jobs_dir=jobs)
    )
    if outcome.result.status != "ok":
        raise SystemExit(f"the recording ended {outcome.result.status}: {outcome.result.error}")
    checkpoints = f", a checkpoint every {every} steps" if every else ""
    print(f"  recorded{checkpoints} in {wall:.1f} s wall, {cpu:.1f} CPU-s", flush=True)
    return outcome.run_dir


async def bench(args: argparse.Namespace, folder: Path) -> int:
    os.environ[AGENTS_FILE_ENV] = str(AGENTS)
    model = script(folder, args.steps, args.step_seconds)
    print(f"recording {args.steps} steps of urllib-session on sqlite-ledger ({args.sandbox})", flush=True)
    plain = await record(args, folder, model, 0)
    checkpointed = await record(args, folder, model, args.checkpoint_every)
    ways: list[tuple[str, Path, Via]] = [
        ("--via replay", plain, "replay"),
        ("--via snapshot (prefix rebuilt once)", plain, "snapshot"),
        (f"--via snapshot (run --checkpoint-every {args.checkpoint_every})", checkpointed, "snapshot"),
    ]
    rows: list[tuple[str, float, float, BranchSummary]] = []
    for index, (label, run, via) in enumerate(ways):
        print(f"branching at step {args.at} into {args.n} children {label}", flush=True)
        summary, wall, cpu = await measured(
            lambda run=run, via=via, index=index: branch(  # type: ignore[misc]
                run,
                at=args.at,
                models=[model],
                n=args.n,
                options=RolloutSettings(sandbox=args.sandbox),
                runner=RunnerOptions(concurrency=args.concurrency),
                output=folder / f"tree-{index}",
                via=via,
            )
        )
        rows.append((label, wall, cpu, summary))
        statuses = [child.status for child in summary.children]
        print(f"  {wall:.1f} s wall, {cpu:.1f} CPU-s; children: {statuses}; {summary.note}", flush=True)
    _, replay_wall, replay_cpu, _ = rows[0]
    print()
    title = f"branch at {args.at} of {args.steps} steps, {args.n} children"
    print(f"| {title} | wall s | CPU-s | wall / replay | CPU / replay |")
    print("|---|---|---|---|---|")
    for label, wall, cpu, _ in rows:
        print(f"| {label} | {wall:.1f} | {cpu:.1f} | {wall / replay_wall:.2f}x | {cpu / replay_cpu:.2f}x |")
    layers = {summary.checkpoint: summary.layers for _, _, _, summary in rows[1:]}
    print(f"\nsnapshot layers (digests): {layers}")
    snapshot, restore, size = await state_seconds(args.sandbox, args.db_mb)
    print(
        f"\nSQLite state of {args.db_mb} MB ({size / 1e6:.0f} MB copied): "
        f"snapshot {snapshot:.2f} s, restore {restore:.2f} s"
    )
    for step in (checkpointed / CHECKPOINTS_DIR).glob("step-*"):
        reference = pool_reference(step)
        if reference is not None:
            disk.remove(PoolSnapshot.parse(reference).pool)
            break  # one pool holds every step's snapshot
    children = [child for _, _, _, summary in rows for child in summary.children]
    return 0 if all(child.status == "ok" for child in children) else 1


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--at", type=int, default=30)
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--sandbox", default="local")
    parser.add_argument("--db-mb", type=int, default=100)
    parser.add_argument("--keep-snapshots", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reroll-bench-branch-") as folder:
        return asyncio.run(bench(args, Path(folder)))


if __name__ == "__main__":
    sys.exit(main())
