"""Benchmark: one job of N concurrent local rollouts; wall time, peak memory, errors.

    .venv/bin/python scripts/bench/jobs.py [--rollouts 32] [--concurrency 32]
        [--agent mini-swe-agent|oracle] [--task examples/tasks/hello-file] [--max-retries 2]
        [--max-starting 4] [--executor asyncio|ray]

Runs the job in this process (`reroll.jobs.runner.run_job`) with the bundled scripted model, in the
`local` sandbox, into a temporary jobs dir, while sampling every 0.2 s the resident memory
(RSS) of this process and all its descendants (proxies, scripted model servers, sidecars,
agents). Prints the figures, and exits 1 if any rollout did not end ``ok``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
from reroll.jobs.jobfile import DEFAULT_MAX_STARTING, JobSpec
from reroll.jobs.runner import run_job
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_SECONDS = 0.2


class TreeSampler:
    """Peak RSS (bytes) and process count of this process and its descendants."""

    def __init__(self) -> None:
        self.peak_rss_bytes = 0
        self.peak_processes = 0

    def sample(self) -> None:
        me = psutil.Process()
        rss, count = 0, 0
        for process in [me, *me.children(recursive=True)]:
            try:
                rss += process.memory_info().rss
                count += 1
            except psutil.Error:  # exited meanwhile
                continue
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.peak_processes = max(self.peak_processes, count)

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(SAMPLE_SECONDS)


async def bench(args: argparse.Namespace, jobs_dir: Path) -> int:
    spec = JobSpec(
        name="bench",
        tasks=[args.task.resolve()],
        agents=[args.agent],
        models=["scripted"],
        repeats=args.rollouts,
        concurrency=args.concurrency,
        max_retries=args.max_retries,
        max_starting=args.max_starting,
        executor=args.executor,
    )
    sampler = TreeSampler()
    sampling = asyncio.create_task(sampler.run())
    started = time.monotonic()
    summary = await run_job(spec, jobs_dir=jobs_dir, console=Console(stderr=True))
    wall = time.monotonic() - started
    sampling.cancel()
    counts = summary.totals.status_counts
    seconds = [r.total_seconds or 0.0 for r in summary.rollouts]
    print(f"rollouts:          {len(summary.rollouts)} ({args.agent}, scripted model, local sandbox)")
    print(f"concurrency:       {args.concurrency} on {psutil.cpu_count()} cores, executor {args.executor}")
    print(f"max starting:      {args.max_starting}")
    print(f"status counts:     {counts}")
    print(f"errors:            {counts.get('error', 0) + counts.get('unknown', 0)}")
    print(f"retries:           {summary.totals.retries} (infrastructure failures retried)")
    causes = Counter(error.splitlines()[0] for r in summary.rollouts for error in r.retried_errors)
    for cause, count in causes.most_common():
        print(f"  {count} x {cause}")
    print(f"wall time:         {wall:.1f} s")
    print(f"rollout time:      mean {sum(seconds) / len(seconds):.1f} s, max {max(seconds):.1f} s")
    print(f"throughput:        {len(seconds) / wall * 60:.1f} rollouts/min")
    print(f"peak RSS (tree):   {sampler.peak_rss_bytes / 2**20:.0f} MiB")
    print(f"peak processes:    {sampler.peak_processes}")
    print(f"exchanges, tokens: {summary.totals.exchanges}, {summary.totals.tokens}")
    return 0 if counts.get("ok", 0) == len(summary.rollouts) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--agent", default="mini-swe-agent")
    parser.add_argument("--max-retries", type=int, default=2)
    parser.add_argument("--max-starting", type=int, default=DEFAULT_MAX_STARTING)
    parser.add_argument("--executor", default="asyncio")
    parser.add_argument("--task", type=Path, default=ROOT / "examples" / "tasks" / "hello-file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reroll-bench-") as jobs_dir:
        return asyncio.run(bench(args, Path(jobs_dir)))


if __name__ == "__main__":
    sys.exit(main())
