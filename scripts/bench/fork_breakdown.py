"""Benchmark: where a child's start goes when ``reroll branch --via snapshot`` forks from a kept
pool checkpoint, from the command's start to the first child's first live request.

    .venv/bin/python scripts/bench/fork_breakdown.py [--steps 40] [--at 10,30] [-n 8]
        [--concurrency 4] [--checkpoint-keep 64] [--run RUN_FOLDER] [--sandbox local]

Records one run of the resumable ``urllib-session`` agent on examples/tasks/sqlite-ledger (as
scripts/bench/branch.py does, with a pool checkpoint at every step) unless `--run` names one, then
branches it at each step of `--at` into `-n` children by snapshot, in this process, with a timer
around each stage of the branch and of every child (the functions are wrapped here: nothing in
reroll is changed for it). Prints the ``import reroll.cli`` time (what the CLI pays before
``branch`` starts); per value of `--at`, what a ``reroll branch`` command imports before its child's
agent starts (modules and ``-X importtime`` seconds: `cli_imports.branch_imports`) and the fork
latency of a ``reroll branch`` command run as its own process (imports included, the shared proxy
and model server started cold) and that command's timeline, run once more with its stages timed from
its spawn (`command_timeline`; `stage_timer` wraps them as their modules load, and times the import
of ``reroll.cli.app`` and ``reroll.jobs.branch``); then, per branching in this process, the fork
latency (the branch's start to the first live request of any child, from the children's
trajectories), then a timeline: each stage of the branch, and of the child that went live first,
with its start and its seconds (a stage inside another is indented; the LLM side and the sandbox's
start overlap), one line per child (its start, the seconds of its LLM side, sandbox start and
agent), and each stage's median over the children. Run it under ``flock /tmp/reroll-docker.lock``.
The pools of a run it recorded are removed at the end unless `--keep-recording` names a jobs folder
to record into (then pass the run to `--run`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from branch import AGENTS, TASK, branch_arguments, first_live, script
from cli_imports import branch_imports, command_fork_latency, first_live_of
from reroll.agents import AGENTS_FILE_ENV
from reroll.jobs.branch import branch
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.commands.record import run_task
from reroll.sandbox.local.storage import remove_pools_under
from reroll.settings import RolloutSettings
from stage_timer import SPANS, STAGES, Span, instrument

COMMAND = """
import atexit, json, sys
sys.path.insert(0, {bench!r})
import stage_timer

stage_timer.instrument_on_import()
atexit.register(lambda: open({out!r}, "w").write(json.dumps([vars(s) for s in stage_timer.SPANS])))
from reroll.cli.early import main

sys.argv = ["reroll", *{argv!r}]
main()
"""
"""A ``reroll branch`` command (the console script's entry, `reroll.cli.early.main`) with its stages
timed as their modules load; its spans go to a file."""


def command_timeline(run: Path, at: int, n: int, model: str, output: Path) -> None:
    """Run ``reroll branch RUN --at AT -n N --model MODEL --via snapshot`` as its own process, its
    stages timed (`stage_timer.instrument_on_import`), and print its timeline from its spawn (as
    `report` does): where a command's fork latency goes, its imports and shared processes included.

    Raises:
        SystemExit: the command wrote no tree.
    """
    argv = ["branch", str(run), "--at", str(at), "-n", str(n), "--model", model, "--via", "snapshot"]
    argv += ["--output", str(output / "tree")]
    spans_file = output / "spans.json"
    output.mkdir(parents=True)
    code = COMMAND.format(bench=str(Path(__file__).resolve().parent), out=str(spans_file), argv=argv)
    began = time.time()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if not spans_file.is_file():
        raise SystemExit(f"the timed reroll branch failed ({done.returncode}): {done.stderr[-2000:]}")
    spans = [Span(**span) for span in json.loads(spans_file.read_text())]
    report(spans, began, first_live_of(output / "tree"))


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to ``import reroll.cli.app`` (the CLI's start)."""
    code = "import time; t = time.perf_counter(); import reroll.cli.app; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout)


def report(spans: list[Span], began: float, live: tuple[float, str] | None) -> None:
    """Print the timeline of the branch and of the child that went live first, and medians."""
    latency = f"{live[0] - began:.3f} s" if live else "none went live"
    print(f"  fork latency: {latency}")
    first = live[1] if live is not None else min(s.child for s in spans)
    labels = [label for _, _, label in STAGES]
    for who in ("branch", first):
        print(f"  {who}: stage (start s after the branch started, seconds)")
        mine = sorted((s for s in spans if s.child == who), key=lambda s: (s.start, -s.end))
        stack: list[Span] = []
        for span in mine:
            while stack and (span.start >= stack[-1].end or span.end > stack[-1].end):
                stack.pop()
            indent, offset = "  " * len(stack), span.start - began
            print(f"    {indent}{span.label:<48} {offset:7.3f} {span.end - span.start:7.3f}")
            stack.append(span)
    if live is not None:
        print(f"    {'first live request':<48} {live[0] - began:7.3f}")
    per_label: dict[str, list[float]] = defaultdict(list)
    for span in spans:
        if span.child != "branch":
            per_label[span.label].append(span.end - span.start)
    each_child(spans, began)
    print("  median over the children (seconds, count)")
    for label in labels:
        if label in per_label:
            values = per_label[label]
            print(f"    {label:<48} {statistics.median(values):7.3f}  x{len(values)}")


def each_child(spans: list[Span], began: float) -> None:
    """Print one line per child: its start, and the seconds of its LLM side, of its sandbox's
    start and of its agent."""
    print("  each child: start, seconds of its LLM side, of its sandbox start, of its agent")
    shown = ("model server and proxy registration", "sandbox start", "agent (to its exit)")
    for child in sorted({s.child for s in spans} - {"branch"}):
        mine = {s.label: s for s in spans if s.child == child}
        seconds = " ".join(f"{mine[k].end - mine[k].start:6.3f}" if k in mine else "     -" for k in shown)
        print(f"    {child:<48} {mine['child'].start - began:7.3f} {seconds}")


async def bench(args: argparse.Namespace, folder: Path) -> int:
    os.environ[AGENTS_FILE_ENV] = str(AGENTS)
    model = script(folder, args.steps, args.step_seconds)
    run = Path(args.run) if args.run else None
    if run is None:
        print(f"recording {args.steps} steps of urllib-session on sqlite-ledger ({args.sandbox})", flush=True)
        options = RolloutSettings(sandbox=args.sandbox, checkpoint_keep=args.checkpoint_keep)
        jobs = Path(args.keep_recording) if args.keep_recording else folder
        outcome = await run_task(
            TASK, agent_name="urllib-session", model=model, options=options, jobs_dir=jobs
        )
        if outcome.result.status != "ok":
            raise SystemExit(f"the recording ended {outcome.result.status}: {outcome.result.error}")
        run = outcome.run_dir
        print(f"  recorded: {run}")
    print(f"import reroll.cli.app: {import_seconds():.3f} s (before the command starts)")
    for at in (int(at) for at in args.at.split(",")):
        found = branch_imports(run, at, model, folder / f"imports-{at}")
        print(found.line(f"reroll branch --at {at}, to the child's agent"))
        latency, wall = command_fork_latency(run, at, args.n, model, folder / f"command-{at}")
        label = f"reroll branch --at {at} -n {args.n} (a command)"
        print(f"{label}: fork latency {latency:.3f} s, wall {wall:.1f} s", flush=True)
        print(f"the same command, its stages timed from its spawn (-n {args.n})", flush=True)
        command_timeline(run, at, args.n, model, folder / f"timed-{at}")
    instrument()
    failed = 0
    for at in (int(at) for at in args.at.split(",")):
        print(f"\nbranching at step {at} into {args.n} children by snapshot", flush=True)
        SPANS.clear()
        began = time.time()
        summary = await branch(
            run,
            at=at,
            models=[model],
            n=args.n,
            options=RolloutSettings(sandbox=args.sandbox),
            runner=RunnerOptions(concurrency=args.concurrency, max_starting=args.concurrency),
            output=folder / f"tree-{at}",
            via="snapshot",
        )
        print(f"  {time.time() - began:.1f} s wall; {summary.note}")
        report(list(SPANS), began, first_live(summary))
        failed += sum(child.status != "ok" for child in summary.children)
    if not args.run and not args.keep_recording:
        remove_pools_under(folder)
    return 1 if failed else 0


def main() -> int:
    parser = branch_arguments(concurrency=4)
    parser.add_argument("--checkpoint-keep", type=int, default=64)
    parser.add_argument("--run", help="a recorded run folder to branch (recorded with --checkpoint-keep)")
    parser.add_argument("--sandbox", default="local", help="the recording's and the children's sandbox")
    parser.add_argument("--keep-recording", help="record into this jobs folder and keep it (for --run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reroll-bench-fork-") as folder:
        return asyncio.run(bench(args, Path(folder)))


if __name__ == "__main__":
    sys.exit(main())
