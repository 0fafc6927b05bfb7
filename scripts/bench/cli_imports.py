"""Benchmark: what the ``reroll`` command imports before it does its work, in figures that do not
swing with the machine's load (modules loaded, ``-X importtime`` microseconds), and the wall time
of ``reroll --help``.

    .venv/bin/python scripts/bench/cli_imports.py [--run RUN_FOLDER --model MODEL --at K
        [-n 8] [--repeat 3]]

Prints, for ``import reroll.cli.app``, ``reroll --help`` and ``reroll branch --help``, each in a
fresh interpreter: the modules in `sys.modules` after it, the sum of the ``-X importtime``
cumulative microseconds of its top-level imports (every module imported is in one of them), and
which of the heavy modules `WATCHED` it loaded; then the median wall seconds of 5
``reroll --help``. With `--run` (a run recorded with a pool checkpoint per step, e.g. by
``fork_breakdown.py --keep-recording``) it also runs ``reroll branch RUN --at K -n 1 --model MODEL
--via snapshot`` and gives the same figures up to the moment its child starts its agent (what
the command imports before its first child's first request), then times `--repeat` commands
``reroll branch RUN --at K -n N`` from their spawn to their first live request (the fork
latency of a command, its imports and the shared processes' cold start included) and prints
their median; or, with `--prestart N`, only times N commands from their spawn to their start of
the shared proxy and model server (where the command is stopped: no process or sandbox starts,
no flock needed), the part of a fork's latency that is the command's own start. The others start
local sandboxes: run it under ``flock /tmp/reroll-docker.lock``, with
``REROLL_AGENTS_FILE`` naming the run's agent when it is not built in. `branch_imports` and
`command_fork_latency` are what ``fork_breakdown.py`` prints.
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
from dataclasses import dataclass
from pathlib import Path

WATCHED = ("docker", "aiohttp.web", "requests", "reroll_proxy.scripted", "reroll.jobs.branch", "ray")
"""Modules the CLI's start should not pay for unless the command needs them."""

MARK = "reroll-bench: the first child starts its agent"

DONE = f"""
import json, sys
print(json.dumps([len(sys.modules), [name for name in {WATCHED!r} if name in sys.modules]]))
"""

HELP = """
import sys
from reroll.cli.app import app
try:
    app({argv!r})
except SystemExit:
    pass
"""

BRANCH = """
import functools, json, sys
import reroll.rollout.agent_phase as phase

original = phase.run_agent
marked = []


@functools.wraps(original)
async def run_agent(*args, **kwargs):
    if not marked:
        marked.append(1)
        loaded = [name for name in {watched!r} if name in sys.modules]
        print({mark!r}, file=sys.stderr, flush=True)
        print(json.dumps([len(sys.modules), loaded]), flush=True)
    return await original(*args, **kwargs)


for module in list(sys.modules.values()):
    if getattr(module, "run_agent", None) is original:
        module.run_agent = run_agent
from reroll.cli.app import app

try:
    app({argv!r})
except SystemExit:
    pass
"""


TO_PRESTART = """
import importlib.abc, importlib.util, os, sys, time

T0 = float(os.environ["REROLL_BENCH_T0"])


class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "reroll.host.shared_process":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)

            def prestart(*args, **kwargs):
                print(f"{{time.time() - T0:.6f}} {{len(sys.modules)}}", flush=True)
                os._exit(0)

            module.prestart = prestart

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Hook())
from reroll.cli.app import app

app({argv!r})
"""


@dataclass
class Figures:
    modules: int
    """Modules in `sys.modules`."""
    microseconds: int
    """Sum of the top-level ``-X importtime`` cumulative microseconds."""
    watched: list[str]
    """The `WATCHED` modules loaded."""

    def line(self, label: str) -> str:
        heavy = ", ".join(self.watched) or "none"
        seconds = self.microseconds / 1e6
        return f"{label:<44} {self.modules:5d} modules {seconds:7.3f} s imports; watched: {heavy}"


def importtime_total(stderr: str, until: str | None = None) -> int:
    """Sum of the cumulative microseconds of the top-level imports in ``-X importtime`` output
    `stderr` (lines ``import time: SELF | CUMULATIVE | NAME``, nested names indented), up to the
    line `until` if given."""
    total = 0
    for line in stderr.splitlines():
        if until is not None and line.strip() == until:
            break
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if cumulative.strip().isdigit() and not name[1:].startswith(" "):
            total += int(cumulative)
    return total


def figures(code: str, until: str | None = None) -> Figures:
    """`Figures` of running `code` in a fresh ``python -X importtime`` whose stdout's last line is
    ``[modules, watched]`` (JSON). Raises `subprocess.CalledProcessError` if it fails."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    counts = [line for line in done.stdout.splitlines() if line.startswith("[")]
    if not counts:
        raise SystemExit(f"no figures printed:\n{done.stdout}\n{done.stderr[-3000:]}")
    modules, watched = json.loads(counts[-1])
    return Figures(modules, importtime_total(done.stderr, until), watched)


def help_figures(argv: list[str]) -> Figures:
    """`Figures` of ``reroll ARGV`` (a help) run in a fresh interpreter."""
    return figures(HELP.format(argv=argv) + DONE)


def branch_imports(run: Path, at: int, model: str, output: Path) -> Figures:
    """`Figures` of ``reroll branch RUN --at AT -n 1 --model MODEL --via snapshot --output OUTPUT``
    up to its child's start of the agent."""
    argv = ["branch", str(run), "--at", str(at), "-n", "1", "--model", model, "--via", "snapshot"]
    argv += ["--output", str(output)]
    return figures(BRANCH.format(watched=WATCHED, mark=MARK, argv=argv), until=MARK)


def command_fork_latency(run: Path, at: int, n: int, model: str, output: Path) -> tuple[float, float]:
    """Seconds from spawning ``reroll branch RUN --at AT -n N --model MODEL --via snapshot
    --output OUTPUT`` (its own process: imports included, the shared proxy and model server
    started cold) to its children's first live request, and its wall seconds.

    Raises:
        SystemExit: the command wrote no tree, or no child went live.
    """
    reroll = Path(sys.executable).parent / "reroll"
    argv = [str(reroll), "branch", str(run), "--at", str(at), "-n", str(n), "--model", model]
    argv += ["--via", "snapshot", "--output", str(output)]
    began = time.time()
    done = subprocess.run(argv, capture_output=True, text=True)
    wall = time.time() - began
    first = first_live_of(output)
    if first is None:
        failed = f"reroll branch failed ({done.returncode}) or no child went live"
        raise SystemExit(f"{failed}: {done.stderr[-2000:]}")
    return first[0] - began, wall


def first_live_of(output: Path) -> tuple[float, str] | None:
    """The earliest live request (``time.time()``) of the children of the tree a ``reroll branch
    --output OUTPUT`` wrote, and that child's folder name; None when it wrote none or none went live."""
    from datetime import datetime

    from reroll.runfolder.run import TRAJECTORY
    from reroll_contracts.trajectory import load_trajectory

    written = sorted(output.glob("*/summary.json"))  # <output>/<run>/summary.json
    if not written:
        return None
    tree = written[0].parent
    firsts = []
    for child in json.loads(written[0].read_bytes())["children"]:
        trajectory = tree / child["folder"] / TRAJECTORY
        exchanges = load_trajectory(trajectory).exchanges if trajectory.is_file() else []
        live = [e.request.timestamp for e in exchanges if e.metadata.source == "live"]
        firsts += [(datetime.fromisoformat(live[0]).timestamp(), child["folder"])] if live else []
    return min(firsts) if firsts else None


def to_prestart(run: Path, at: int, model: str, output: Path) -> tuple[float, int]:
    """Seconds from spawning ``reroll branch RUN --at AT --model MODEL --via snapshot`` to its
    start of the shared proxy and model server (`reroll.host.shared_process.prestart`, where it
    is stopped: no process or sandbox starts), and the modules it holds then: the part of a
    fork's latency the command's own start takes.

    Raises:
        SystemExit: the command ended before it.
    """
    argv = [
        "branch",
        str(run),
        "--at",
        str(at),
        "--model",
        model,
        "--via",
        "snapshot",
        "--output",
        str(output),
    ]
    env = {**os.environ, "REROLL_BENCH_T0": repr(time.time())}
    done = subprocess.run(
        [sys.executable, "-c", TO_PRESTART.format(argv=argv)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(
            f"reroll branch did not reach its prestart: {done.stdout[-1000:]}{done.stderr[-2000:]}"
        )
    seconds, modules = done.stdout.split()[-2:]
    return float(seconds), int(modules)


def help_wall(times: int = 5) -> float:
    """Median wall seconds of `times` runs of ``reroll --help`` (the console script)."""
    reroll = shutil.which("reroll", path=str(Path(sys.executable).parent))
    if reroll is None:
        raise SystemExit("no reroll console script beside this python")
    walls = []
    for _ in range(times):
        began = time.perf_counter()
        subprocess.run([reroll, "--help"], capture_output=True, check=True)
        walls.append(time.perf_counter() - began)
    return statistics.median(walls)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", help="a recorded run folder to branch (with a pool checkpoint per step)")
    parser.add_argument("--model", help="with --run: the children's model")
    parser.add_argument("--at", type=int, default=10)
    parser.add_argument("-n", type=int, default=8, help="with --run: children of the timed commands")
    parser.add_argument("--repeat", type=int, default=0, help="with --run: time this many commands")
    parser.add_argument(
        "--prestart", type=int, default=0, help="with --run: time this many commands to their prestart only"
    )
    args = parser.parse_args()
    if args.run and args.prestart:
        with tempfile.TemporaryDirectory(prefix="reroll-bench-imports-") as folder:
            timed = [
                to_prestart(Path(args.run), args.at, args.model, Path(folder) / str(i))
                for i in range(args.prestart)
            ]
        seconds = statistics.median(second for second, _ in timed)
        print(f"{'reroll branch to its prestart, median':<44} {timed[0][1]:5d} modules {seconds:7.3f} s")
        return 0
    print(figures("import reroll.cli.app" + DONE).line("import reroll.cli.app"))
    print(help_figures(["--help"]).line("reroll --help"))
    print(help_figures(["branch", "--help"]).line("reroll branch --help"))
    print(f"{'reroll --help wall, median of 5':<44} {help_wall():.3f} s")
    if args.run:
        with tempfile.TemporaryDirectory(prefix="reroll-bench-imports-") as folder:
            found = branch_imports(Path(args.run), args.at, args.model, Path(folder) / "tree")
            print(found.line(f"reroll branch --at {args.at}, to the child's agent"), flush=True)
            latencies = []
            for index in range(args.repeat):
                output = Path(folder) / f"command-{index}"
                latency, wall = command_fork_latency(Path(args.run), args.at, args.n, args.model, output)
                label = f"reroll branch --at {args.at} -n {args.n}"
                print(f"{label}: fork latency {latency:.3f} s, wall {wall:.1f} s", flush=True)
                latencies.append(latency)
        if latencies:
            print(f"{'fork latency of a command, median':<44} {statistics.median(latencies):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
