"""Benchmark: many rollouts at once on one machine — throughput, exchange latency, harness memory.

For each N it runs ``reroll job`` with N rollouts of a tiny agent at concurrency N, on the bundled
task ``examples/tasks/hello-file`` with the bundled scripted model. The agent is declared as data
(an agents file named by ``$REROLL_AGENTS_FILE``, as a user declares one): a shell loop that makes
five Chat Completions calls through the rollout's LLM proxy with ``python3`` (present in every
sandbox) and then writes the answer file, so nearly all the memory and CPU measured is reroll's.

Printed per N:

- ``alive``: the most rollouts alive at once (sidecars running at one sample); each agent first
  waits ``--hold`` seconds (default 0.7 s per rollout) so that all N overlap although start-up is bounded by
  the job's ``max_starting``;
- ``rollouts/s``: N / the job's wall time (from the command's start to its end; the hold included);
- ``exchanges/s``: the exchanges recorded in all run folders / that wall time;
- ``p99 exchange ms``: the 99th percentile of the recorded exchanges' ``duration_ms`` (the proxy's
  time from request to response, upstream included);
- ``harness PSS per rollout``: the largest, over samples taken every second while rollouts run,
  of the proportional set size (``/proc/PID/smaps_rollup``, MiB) of every process reroll starts
  *per rollout* (sidecar, namespace and network helpers, per-rollout proxy or model server when
  ``REROLL_PROXY=per-rollout``) divided by the rollouts running at that sample (sidecars counted).
  The controller and the processes it shares between rollouts (``reroll_proxy --shared``, the
  shared scripted model) are printed apart; the agents' own processes are left out;
- ``errors``: rollouts whose status is not ``ok`` or whose reward is not 1.

Run: ``.venv/bin/python scripts/bench/scale.py [--sizes 16 64 256] [--docker-sizes 32]``. The last
two lines, for the largest local N, are exactly ``harness PSS per rollout: X MiB`` and
``errors: N``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REROLL = Path(sys.executable).with_name("reroll")
TASK = ROOT / "examples" / "tasks" / "hello-file"
CALLS = 5
AGENT_SECONDS = 300.0
"""The agent's budget beyond its hold (the job's ``--timeout`` is both): its five ``python3``
start-ups are nearly all of its work, and at N = 256 on 2 shared cores (load near 300 while
1,280 of them run) one agent took over 120 s for them, a timeout that measured no part of reroll."""
CALL = (
    "import json, os, urllib.request as u; "
    "body = json.dumps({'model': 'scripted', 'messages': [{'role': 'user', 'content': 'step'}]}).encode(); "
    "key = os.environ['OPENAI_API_KEY']; "
    "headers = {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}; "
    "url = os.environ['OPENAI_BASE_URL'] + '/chat/completions'; "
    "u.urlopen(u.Request(url, data=body, headers=headers), timeout=120).read()"
)


def agents(hold_seconds: float) -> dict[str, object]:
    """The tiny agent's declaration: it waits `hold_seconds` (so that the rollouts of one N are
    alive at once: start-up is bounded by ``--max-starting``), makes its calls, writes the file."""
    return {
        "tiny-loop": {
            "description": f"A shell loop: {CALLS} LLM calls, then the answer file (scripts/bench/scale.py).",
            "api_format": "openai-chat",
            "launch": f"sleep {hold_seconds:g}; "
            f'for i in $(seq {CALLS}); do python3 -c "{CALL}" || exit 1; done; '
            "echo 'Hello, reroll!' > hello.txt",
            "env": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"},
        }
    }


SCRIPT = "turns:\n  - content: ok\n"
SHARED = ("reroll_proxy --shared",)
"""Command-line marks of the process shared by every rollout (the proxy, serving the scripted model too)."""
SIDECAR = ("reroll-sidecar", "reroll_sidecar")
PER_ROLLOUT = (*SIDECAR, "bwrap", "pasta", "reroll_proxy", "reroll_proxy.scripted", "containerd-shim")
"""Command-line marks of the processes reroll starts for one rollout (checked after `SHARED`); on
docker also the container's shim and its fuse-overlayfs mount, when the storage driver has one."""


@dataclass
class Sample:
    """One look at the processes: PSS (KiB) per class, and how many sidecars ran."""

    controller_kib: int = 0
    shared_kib: int = 0
    per_rollout_kib: int = 0
    sidecars: int = 0
    """Rollouts alive (their sidecars)."""


@dataclass
class Sampler:
    """Samples the process tree of a running job every `interval` seconds in a thread."""

    controller_pid: int
    docker_sandbox: bool
    interval: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(sample(self.controller_pid, self.docker_sandbox))

    def stop(self) -> None:
        self._stop.set()


def pss_kib(pid: int) -> int:
    """The PSS of `pid` in KiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children by ``/proc/*/stat``'s parent field)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def container_processes(controller: int) -> list[int]:
    """The processes of the docker containers `controller` started (label ``reroll.owner``), with
    each one's shim and fuse-overlayfs mount."""
    import docker
    import docker.errors

    client = docker.from_env()
    pids: list[int] = []
    fuse = {pid: command_of(pid) for pid in map(int, filter(str.isdigit, os.listdir("/proc")))}
    fuse = {pid: command for pid, command in fuse.items() if command.startswith("fuse-overlayfs")}
    try:
        containers = client.containers.list(filters={"label": "reroll.owner"})
    except docker.errors.NotFound:  # one went away while it was listed
        return []
    for container in containers:
        if f"/{controller}/" not in container.labels.get("reroll.owner", ""):
            continue
        init = int(container.attrs["State"]["Pid"] or 0)
        if not init:
            continue
        pids += [init, *descendants(init)]
        pids.append(parent_of(init))  # its containerd-shim
        upper = container.attrs.get("GraphDriver", {}).get("Data", {}).get("UpperDir", "")
        pids += [pid for pid, command in fuse.items() if upper and upper.rsplit("/", 1)[0] in command]
    return pids


def sample(controller: int, docker_sandbox: bool) -> Sample:
    """Classify and measure the controller's process tree, and on docker its containers' (see
    the module docstring)."""
    taken = Sample(controller_kib=pss_kib(controller))
    pids = descendants(controller) + (container_processes(controller) if docker_sandbox else [])
    sidecars: set[int] = set()
    for pid in pids:
        command = command_of(pid)
        if any(mark in command for mark in SHARED):
            taken.shared_kib += pss_kib(pid)
        elif any(mark in command for mark in PER_ROLLOUT) or command.startswith("fuse-overlayfs"):
            taken.per_rollout_kib += pss_kib(pid)
            if any(mark in command for mark in SIDECAR):
                sidecars.add(pid)
    # A sidecar is one bundle process that may start others of its own binary: count the topmost.
    taken.sidecars = sum(1 for pid in sidecars if parent_of(pid) not in sidecars)
    return taken


def parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class Outcome:
    """What one N gave."""

    size: int
    sandbox: str
    seconds: float
    exchanges: int
    p99_ms: float
    harness_mib: float
    peak_alive: int
    """The most rollouts alive at one sample."""
    controller_mib: float
    shared_mib: float
    errors: int
    failures: list[str]
    """One line per rollout counted in `errors`: its folder, status, category and error."""


def run_job(size: int, sandbox: str, work: Path, hold_seconds: float) -> Outcome:
    """``reroll job`` of `size` tiny-loop rollouts at concurrency `size` in `sandbox`."""
    (work / "agents.yaml").write_text(json.dumps(agents(hold_seconds)))
    jobs = work / "jobs"
    name = f"scale-{sandbox}-{size}"
    argv = [
        str(REROLL), "job", "--task", str(TASK), "--agent", "tiny-loop",
        "--model", f"scripted:{work / 'script.yaml'}", "--repeats", str(size),
        "--concurrency", str(size), "--sandbox", sandbox, "--jobs-dir", str(jobs), "--job-name", name,
        "--timeout", str(hold_seconds + AGENT_SECONDS),
    ]  # fmt: skip
    env = os.environ | {"REROLL_AGENTS_FILE": str(work / "agents.yaml")}
    started = time.monotonic()
    with open(work / f"{name}.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
        sampler = Sampler(process.pid, sandbox == "docker")
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        process.wait()
        sampler.stop()
        thread.join()
    seconds = time.monotonic() - started
    durations: list[float] = []
    failures: list[str] = []
    runs = [path.parent for path in (jobs / name).glob("*/result.json")]
    for run in runs:
        result = json.loads((run / "result.json").read_text())
        rewards = result.get("rewards") or {}
        if result.get("status") != "ok" or rewards.get("reward") != 1:
            error = ((result.get("error") or "").strip().splitlines() or [""])[0][:200]
            how = f"{result.get('status')} {result.get('error_category')} reward {rewards.get('reward')}"
            failures.append(f"{run.name}: {how} {error}")
        trajectory = run / "trajectory" / "llm_trajectory.jsonl"
        for line in trajectory.read_text().splitlines() if trajectory.exists() else []:
            durations.append(json.loads(line).get("duration_ms", 0.0))
    errors = len(failures) + size - len(runs)  # and those that left no result at all
    if len(runs) < size:
        failures.append(f"{size - len(runs)} rollouts left no result.json")
    busy = [s for s in sampler.samples if s.sidecars] or [Sample(sidecars=1)]
    peak = max(busy, key=lambda s: s.per_rollout_kib / s.sidecars)
    return Outcome(
        size=size,
        sandbox=sandbox,
        seconds=seconds,
        exchanges=len(durations),
        p99_ms=statistics.quantiles(durations, n=100)[98] if len(durations) > 1 else 0.0,
        harness_mib=peak.per_rollout_kib / peak.sidecars / 1024,
        peak_alive=max(s.sidecars for s in busy),
        controller_mib=max(s.controller_kib for s in busy) / 1024,
        shared_mib=max(s.shared_kib for s in busy) / 1024,
        errors=errors,
        failures=failures,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[16, 64, 256], help="local rollouts at once")
    parser.add_argument("--docker-sizes", type=int, nargs="*", default=[32], help="docker rollouts at once")
    parser.add_argument(
        "--hold",
        type=float,
        help="seconds each agent waits before its calls [default: 0.7 s per rollout, so all N overlap]",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="reroll-scale-") as folder:
        work = Path(folder)
        (work / "script.yaml").write_text(SCRIPT)
        plan = [(size, "docker") for size in args.docker_sizes] + [
            (size, "local") for size in sorted(args.sizes)
        ]
        outcomes = []
        for size, sandbox in plan:
            print(f"running {size} rollouts on {sandbox} ...", flush=True)
            hold = args.hold if args.hold is not None else size * 0.7
            outcomes.append(run_job(size, sandbox, work, hold))
        print(
            f"\n{'sandbox':<8} {'N':>5} {'alive':>6} {'rollouts/s':>11} {'exchanges/s':>12} {'p99 ms':>8} "
            f"{'harness MiB/rollout':>20} {'controller MiB':>15} {'shared MiB':>11} {'errors':>7}"
        )
        for o in outcomes:
            print(
                f"{o.sandbox:<8} {o.size:>5} {o.peak_alive:>6} {o.size / o.seconds:>11.2f} "
                f"{o.exchanges / o.seconds:>12.1f} {o.p99_ms:>8.1f} {o.harness_mib:>20.1f} "
                f"{o.controller_mib:>15.1f} {o.shared_mib:>11.1f} {o.errors:>7}"
            )
        for o in outcomes:
            for failure in o.failures:
                print(f"  {o.sandbox} N={o.size}: {failure}")
        last = [o for o in outcomes if o.sandbox == "local"][-1] if args.sizes else outcomes[-1]
        print(f"harness PSS per rollout: {last.harness_mib:.1f} MiB")
        print(f"errors: {last.errors}")


if __name__ == "__main__":
    main()
