"""Benchmark: what the LLM proxy adds to an exchange, against a direct call to the same upstream.

The upstream is the bundled scripted model (a local subprocess), the proxy a real
``python -m reroll_proxy`` subprocess. For each exchange the client (aiohttp, one keep-alive
connection per target) calls the upstream directly and then through each proxy, the targets'
order rotated by one every exchange (a later position measured slower: same code, 0.41 first vs
0.65 later), so all see the same machine load. Measured per exchange, in milliseconds:

- ``total``: request sent -> whole response read (non-streamed and streamed requests);
- ``ttfb``: request sent -> first byte of the response body (streamed requests: the first SSE
  bytes, which the proxy forwards before the stream ends).

Targets: ``direct``; ``record`` (the proxy forwards to the upstream and fsyncs every
exchange to its trajectory); ``record-nofsync`` (the same with ``fsync_each_exchange: false``:
lines only flushed to the OS, which shows what the disk costs); ``intercept`` (``proxy_mode:
intercept``: the client calls ``https://api.openai.com`` through ``HTTPS_PROXY`` = our mitmdump,
trusting its CA; mitmdump sends it to a second recording proxy); ``mitmproxy-reverse`` (for
comparison, a plain ``mitmdump --mode reverse:UPSTREAM``, no addon, with ``stream_large_bodies=1``
so that SSE streams through); ``aiohttp-forward`` (the floor: a bare aiohttp server that forwards
each request with one keep-alive ``aiohttp.ClientSession`` and streams the answer back chunk by
chunk, on uvloop: what any aiohttp proxy pays, before recording anything); ``replay`` (a
proxy replays the ``record`` trajectory with no upstream: the divergence check runs on every
request, each replayed exchange is fsynced to its own trajectory). The figures printed are p50 /
p95 of each target, the added p50 / p95 (target minus direct) and their ratio; the CPU time each
proxy process used per measured exchange (every thread, from ``/proc``: less swayed by the load than
latencies); then, per mode
(non-streamed, streamed), the goal's ratio: the recording proxy's added p50 over the plain
mitmproxy's (``record / mitmproxy-reverse``, goal <= 0.25), and the bare forwarder's beside it.
mitmproxy is installed on first use (see `reroll.host.intercept`). The machine's load swings these
figures from run to run: ``--runs N`` measures N times (every target started afresh each time)
and ends with the median of each mode's ratios over the runs.

``--replay-sizes 100,1000,5000`` measures only how replay's added latency grows with the
recording's length: it records as many non-streamed exchanges as the largest size (a recording
proxy, fsync off), then runs one replay-only proxy per size N on the first N of them, and
alternates ``direct`` and every replay proxy per exchange as above, over min(``--exchanges``,
smallest N - warm-up) exchanges after the warm-up; it prints the added p50 / p95 per size and the
added p50 over the smallest size's (1.0: the cost does not grow with N).

``--baseline PYTHON`` adds the target ``record-baseline``: a recording proxy like ``record`` run by
`PYTHON` (another checkout's interpreter, e.g. ``/work/main/.venv/bin/python``), measured in the same
run, so that a change is compared with the code before it under the same load; its goal ratio is
printed beside ``record``'s.

``--profile FILE`` runs the ``record`` proxy under cProfile (CPU time of its event loop's thread,
from the end of the warm-up on), writes its stats to FILE and prints the functions that took the
most time (own and cumulative), per exchange; its latencies are then the profiler's, not the proxy's.

Run: ``.venv/bin/python scripts/bench/proxy.py [--exchanges 1000] [--format openai-chat] [--runs 1]
[--profile F] [--baseline PYTHON] [--replay-sizes 100,1000,5000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import pstats
import signal
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from reroll.host import intercept
from reroll.host.child_process import ChildProcess
from reroll_contracts.proxy import ProxyConfig, ReplayConfig, UpstreamConfig

TOKEN = "bench-token"
WARMUP_EXCHANGES = 50
ANSWER = "I'll look at the repository first, then run the tests and fix what fails. " * 3
SCRIPT = {
    "turns": [{"content": ANSWER, "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}]
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def request_body(api_format: str, stream: bool) -> dict[str, Any]:
    """A first-turn request with a ~4 KB prompt and one tool, in `api_format`."""
    task = "Fix the failing test in the repository. " * 100
    if api_format == "openai-responses":
        tool = {"type": "function", **TOOLS[0]["function"]}
        return {
            "model": "bench",
            "instructions": "You are an agent.",
            "input": task,
            "tools": [tool],
            "stream": stream,
        }
    if api_format == "anthropic-messages":
        tool = {"name": "bash", "input_schema": TOOLS[0]["function"]["parameters"]}
        messages = [{"role": "user", "content": task}]
        return {
            "model": "bench",
            "max_tokens": 1024,
            "system": "You are an agent.",
            "messages": messages,
            "tools": [tool],
            "stream": stream,
        }
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]
    return {"model": "bench", "messages": messages, "tools": TOOLS, "stream": stream}


PATHS = {
    "openai-chat": "/chat/completions",
    "openai-responses": "/responses",
    "anthropic-messages": "/messages",
}


@dataclass(frozen=True)
class Target:
    """Where the client sends its requests: a base URL, through an HTTP proxy or not."""

    base_url: str
    proxy: str | None = None
    """``HTTPS_PROXY`` of the client (the interceptor), or None."""


def session_for(target: Target, ca_file: Path | None) -> aiohttp.ClientSession:
    """A keep-alive session; through a proxy it trusts `ca_file` (the interceptor's CA)."""
    connector = None
    if target.proxy is not None and ca_file is not None:
        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file)))
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), connector=connector)


async def exchange(
    session: aiohttp.ClientSession, url: str, payload: bytes, proxy: str | None = None
) -> tuple[float, float]:
    """One request: (ttfb, total) in milliseconds."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    started = time.perf_counter()
    async with session.post(url, data=payload, headers=headers, proxy=proxy) as response:
        first = await response.content.readany()
        ttfb = time.perf_counter() - started
        rest = await response.read() if first else b""
        total = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(first + rest)[:300]!r}")
    return ttfb * 1000, total * 1000


async def measure(
    targets: dict[str, Target],
    path: str,
    body: dict[str, Any],
    count: int,
    ca_file: Path | None = None,
    on_warm: Callable[[], None] | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """`count` exchanges per target, alternating targets per exchange, the order rotated by one
    each time (after a warm-up, at the end of which `on_warm` is called)."""
    payload = orjson.dumps(body)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    sessions = {name: session_for(target, ca_file) for name, target in targets.items()}
    try:
        for number in range(WARMUP_EXCHANGES + count):
            if number == WARMUP_EXCHANGES and on_warm is not None:
                on_warm()
            names = list(targets)
            shift = number % len(names)  # each target in each position as often: no order bias
            for name in names[shift:] + names[:shift]:
                target = targets[name]
                timing = await exchange(sessions[name], target.base_url + path, payload, target.proxy)
                if number >= WARMUP_EXCHANGES:
                    results[name].append(timing)
    finally:
        for session in sessions.values():
            await session.close()
    return results


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, every thread) process `pid` used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def percentile(values: list[float], fraction: float) -> float:
    """The `fraction` quantile (0..1) of `values`."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(fraction * 100) - 1]


def report(title: str, results: dict[str, list[tuple[float, float]]], which: int, label: str) -> None:
    """Print p50 / p95 of each target and of the added time against ``direct``."""
    direct = [timing[which] for timing in results["direct"]]
    d50, d95 = percentile(direct, 0.5), percentile(direct, 0.95)
    print(f"{title} — {label} (ms)    p50      p95    added p50  added p95  ratio p50  ratio p95")
    for name, timings in results.items():
        values = [timing[which] for timing in timings]
        p50, p95 = percentile(values, 0.5), percentile(values, 0.95)
        added = (
            ""
            if name == "direct"
            else f"{p50 - d50:+9.3f}  {p95 - d95:+9.3f}  {p50 / d50:9.2f}  {p95 / d95:9.2f}"
        )
        print(f"  {name:<17}      {p50:7.3f}  {p95:7.3f}  {added}")


@contextlib.asynccontextmanager
async def plain_mitmdump(upstream: str, work: Path) -> AsyncIterator[tuple[str, int]]:
    """A plain ``mitmdump`` reverse proxy in front of `upstream` (``http://HOST:PORT``); yields its
    URL and its pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [str(intercept.ensure_mitmproxy()), "-c", "from mitmproxy.tools.main import mitmdump; mitmdump()"]
    argv += [
        "--quiet",
        "--mode",
        f"reverse:{upstream}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
    ]
    argv += ["--set", "stream_large_bodies=1", "--set", "flow_detail=0", "--set", f"confdir={work / 'mitm'}"]
    with open(work / "mitmdump.log", "wb") as log:
        process = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    try:
        for _ in range(300):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"mitmdump did not listen on {port}: {(work / 'mitmdump.log').read_text()}")
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        await process.wait()


PROFILED = """
import cProfile, signal, sys, time
from reroll_proxy.__main__ import main
profiler = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
try:
    code = main(sys.argv[2:])
finally:
    profiler.disable()
    profiler.dump_stats(sys.argv[1])
sys.exit(code)
"""
"""A proxy whose cProfile starts at SIGUSR1 (after the warm-up) and is dumped at exit to argv[1].
It counts the CPU time of the main thread: on a loaded machine, wall time would charge the
moments the proxy was not scheduled to whatever call it was in (often a socket write)."""


FORWARDER = """
import asyncio, sys, aiohttp, uvloop
from aiohttp import web
from reroll_contracts.service import write_ready_file

async def main(upstream, ready_file):
    session = aiohttp.ClientSession()

    async def forward(request):
        body = await request.read()
        headers = {"Content-Type": "application/json", "Authorization": request.headers["Authorization"]}
        url = upstream + request.path.removeprefix("/v1")
        async with session.post(url, data=body, headers=headers) as answer:
            kind = answer.content_type
            if kind != "text/event-stream":
                return web.Response(status=answer.status, body=await answer.read(), content_type=kind)
            response = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/{path:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    write_ready_file(ready_file, "127.0.0.1", site._server.sockets[0].getsockname()[1])
    await asyncio.Event().wait()

uvloop.run(main(sys.argv[1], __import__("pathlib").Path(sys.argv[3])))
"""
"""A bare aiohttp forwarder (argv: UPSTREAM ``--ready-file`` F): the floor of any aiohttp proxy."""


def proxy_process(
    name: str, config: ProxyConfig, work: Path, profile: Path | None = None, python: str | None = None
) -> ChildProcess:
    """A ``python -m reroll_proxy`` child with `config` written to ``<work>/<name>.json``; with
    `profile`, one that starts profiling at SIGUSR1 and writes the stats there when it stops; with
    `python`, run by that interpreter (another checkout's)."""
    (work / f"{name}.json").write_text(config.model_dump_json())
    command = None if profile is None else [sys.executable, "-c", PROFILED, str(profile)]
    command = [python, "-m", "reroll_proxy"] if python is not None else command
    args = ["--config", str(work / f"{name}.json")]
    return ChildProcess("reroll_proxy", args, workdir=work, name=name, command=command)


Ratios = tuple[float, float, float | None]
"""The recording proxy's added p50 over the plain mitmproxy's, the bare forwarder's, and the
baseline recording proxy's (``--baseline``; else None)."""


def goal_ratio(title: str, results: dict[str, list[tuple[float, float]]]) -> Ratios:
    """Print the recording proxy's added p50 over the plain mitmproxy's (the goal: <= 0.25), the
    bare aiohttp forwarder's and the baseline's (if measured); return them."""
    totals = {name: percentile([timing[1] for timing in timings], 0.5) for name, timings in results.items()}
    ours, theirs = totals["record"] - totals["direct"], totals["mitmproxy-reverse"] - totals["direct"]
    floor = totals["aiohttp-forward"] - totals["direct"]
    baseline = totals["record-baseline"] - totals["direct"] if "record-baseline" in totals else None
    then = "" if baseline is None else f"; record-baseline's: {baseline / theirs:.2f}"
    print(
        f"{title}: record added p50 {ours:+.3f} ms / mitmproxy-reverse added p50 {theirs:+.3f} ms"
        f" = ratio {ours / theirs:.2f} (goal <= 0.25; the bare aiohttp forwarder's:"
        f" {floor / theirs:.2f}{then})"
    )
    return ours / theirs, floor / theirs, None if baseline is None else baseline / theirs


def print_medians(runs: list[dict[str, Ratios]]) -> None:
    """The median over `runs` of each mode's ratios (`goal_ratio`)."""
    print(f"\nmedian of {len(runs)} runs:")
    for mode in runs[0]:
        ours = statistics.median(run[mode][0] for run in runs)
        floor = statistics.median(run[mode][1] for run in runs)
        values = ", ".join(f"{run[mode][0]:.2f}" for run in runs)
        baselines = [ratio for run in runs if (ratio := run[mode][2]) is not None]
        then = f"; record-baseline's {statistics.median(baselines):.2f}" if baselines else ""
        print(
            f"  {mode}: record / mitmproxy-reverse {ours:.2f} ({values});"
            f" the bare forwarder's {floor:.2f}{then}"
        )


def print_profile(profile: Path, exchanges: int) -> None:
    """The functions of the profiled proxy that took the most time, per exchange."""
    stats = pstats.Stats(str(profile))
    total = sum(timing[2] for timing in stats.stats.values())  # type: ignore[attr-defined]
    count = 2 * exchanges + WARMUP_EXCHANGES  # from the end of the non-streamed warm-up on
    print(
        f"\nprofile of the record proxy ({profile}): {total / count * 1e6:.0f} us of CPU per exchange"
        " (the profiler's own overhead included: read the shares, not the absolutes)"
    )
    for key, column in (("tottime", 2), ("cumtime", 3)):
        print(f"-- top by {key} (us per exchange) --")
        rows = sorted(stats.stats.items(), key=lambda item: item[1][column], reverse=True)  # type: ignore[attr-defined]
        for (file, line, function), (_, calls, own, cumulative, _) in rows[:25]:
            own_us, cumulative_us, per = own / count * 1e6, cumulative / count * 1e6, calls / count
            where = f"{Path(file).name}:{line}({function})"
            print(f"  {own_us:7.1f} own  {cumulative_us:7.1f} cum  {per:5.1f}x  {where}")


async def replay_scaling(sizes: list[int], exchanges: int, api_format: str) -> None:
    """Replay's added latency against the recording's length (see the module docstring)."""
    body = request_body(api_format, False)
    count = min(exchanges, min(sizes) - WARMUP_EXCHANGES)
    with tempfile.TemporaryDirectory(prefix="reroll-bench-") as folder:
        work = Path(folder)
        (work / "script.json").write_bytes(orjson.dumps(SCRIPT))
        async with ChildProcess(
            "reroll_proxy.scripted", ["--script", str(work / "script.json")], workdir=work, name="model"
        ) as model:
            upstream = model.ready.address
            record_config = ProxyConfig(
                token=TOKEN,
                trajectory_path=work / "record.jsonl",
                upstream=UpstreamConfig(base_url=upstream),
                fsync_each_exchange=False,
            )
            async with (
                proxy_process("record", record_config, work) as proxy,
                session_for(Target(proxy.ready.address), None) as session,
            ):
                for _ in range(max(sizes)):
                    await exchange(session, proxy.ready.address + PATHS[api_format], orjson.dumps(body))
            lines = (work / "record.jsonl").read_bytes().splitlines(keepends=True)  # one exchange a line
            async with contextlib.AsyncExitStack() as stack:
                targets = {"direct": Target(upstream)}
                for size in sizes:
                    (work / f"record-{size}.jsonl").write_bytes(b"".join(lines[:size]))
                    replay_config = ProxyConfig(
                        token=TOKEN,
                        trajectory_path=work / f"replay-{size}.jsonl",
                        replay=ReplayConfig(trajectory_path=work / f"record-{size}.jsonl"),
                    )
                    replay = await stack.enter_async_context(
                        proxy_process(f"replay-{size}", replay_config, work)
                    )
                    targets[f"replay-{size}"] = Target(replay.ready.address)
                results = await measure(targets, PATHS[api_format], body, count)
    direct = [percentile([timing[1] for timing in results["direct"]], q) for q in (0.5, 0.95)]
    print(f"replay against the recording's length: {api_format}, non-streamed, total (ms), {count} exchanges")
    print("  recorded   added p50  added p95  added p50 / smallest's")
    smallest = None
    for size in sizes:
        totals = [timing[1] for timing in results[f"replay-{size}"]]
        p50, p95 = (percentile(totals, q) - d for q, d in zip((0.5, 0.95), direct, strict=True))
        smallest = p50 if smallest is None else smallest
        print(f"  {size:8d}  {p50:+9.3f}  {p95:+9.3f}  {p50 / smallest:9.2f}")


async def measure_replay(
    work: Path, trajectory: Path, exchanges: int, api_format: str
) -> dict[bool, list[tuple[float, float]]]:
    """A replay proxy serving `trajectory` (the record target's recording, in order: warm-up and
    measured exchanges alike), measured non-streamed then streamed: streamed → its timings."""
    replay_config = ProxyConfig(
        token=TOKEN,
        trajectory_path=work / "replay.jsonl",
        replay=ReplayConfig(trajectory_path=trajectory),
    )
    runs = {}
    async with proxy_process("replay", replay_config, work) as replay:
        for stream in (False, True):
            body = request_body(api_format, stream)
            target = {"replay": Target(replay.ready.address)}
            runs[stream] = (await measure(target, PATHS[api_format], body, exchanges))["replay"]
    return runs


async def main(
    exchanges: int, api_format: str, profile: Path | None = None, baseline: str | None = None
) -> dict[str, Ratios]:
    """One run of every target, both modes (``record-baseline`` run by `baseline`, if given);
    returns each mode's `goal_ratio`."""
    with tempfile.TemporaryDirectory(prefix="reroll-bench-") as folder:
        work = Path(folder)
        (work / "script.json").write_bytes(orjson.dumps(SCRIPT))
        trajectory = work / "record.jsonl"
        ca_file = work / "ca.pem"
        await asyncio.to_thread(intercept.ensure_mitmproxy)
        ca_file.write_bytes(intercept.ca_bundle())
        async with contextlib.AsyncExitStack() as stack:
            model = await stack.enter_async_context(
                ChildProcess(
                    "reroll_proxy.scripted",
                    ["--script", str(work / "script.json")],
                    workdir=work,
                    name="model",
                )
            )
            upstream = model.ready.address
            record_config = ProxyConfig(
                token=TOKEN, trajectory_path=trajectory, upstream=UpstreamConfig(base_url=upstream)
            )
            extra: dict[str, Target] = {}
            pids: dict[str, int] = {}
            if baseline is not None:
                then = record_config.model_copy(update={"trajectory_path": work / "baseline.jsonl"})
                old = await stack.enter_async_context(proxy_process("baseline", then, work, python=baseline))
                extra["record-baseline"] = Target(old.ready.address)
                pids["record-baseline"] = old.ready.pid
            async with (
                proxy_process("record", record_config, work, profile) as proxy,
                proxy_process(
                    "nofsync",
                    record_config.model_copy(
                        update={"trajectory_path": work / "nofsync.jsonl", "fsync_each_exchange": False}
                    ),
                    work,
                ) as nofsync,
                proxy_process(
                    "behind",
                    record_config.model_copy(update={"trajectory_path": work / "behind.jsonl"}),
                    work,
                ) as behind,
                intercept.Interceptor(target=behind.ready.address, token=TOKEN, workdir=work) as front,
                plain_mitmdump(upstream.removesuffix("/v1"), work) as (reverse, reverse_pid),
                ChildProcess(
                    "forwarder",
                    [upstream],
                    workdir=work,
                    name="forwarder",
                    command=[sys.executable, "-c", FORWARDER],
                ) as forwarder,
            ):
                targets = {
                    "direct": Target(upstream),
                    "record": Target(proxy.ready.address),
                    "record-nofsync": Target(nofsync.ready.address),
                    "intercept": Target("https://api.openai.com/v1", proxy=front.proxy_url),
                    "mitmproxy-reverse": Target(reverse + "/v1"),
                    "aiohttp-forward": Target(forwarder.ready.address),
                    **extra,
                }
                pid = proxy.ready.pid
                start_profile = None if profile is None else functools.partial(os.kill, pid, signal.SIGUSR1)
                pids |= {"record": pid, "record-nofsync": nofsync.ready.pid, "mitmproxy-reverse": reverse_pid}
                pids["aiohttp-forward"] = forwarder.ready.pid
                runs, cpu = await measure_modes(targets, pids, api_format, exchanges, ca_file, start_profile)
        for stream, replayed in (await measure_replay(work, trajectory, exchanges, api_format)).items():
            runs[stream]["replay"] = replayed
    return summarise(runs, cpu, exchanges, api_format, profile)


async def measure_modes(
    targets: dict[str, Target],
    pids: dict[str, int],
    api_format: str,
    exchanges: int,
    ca_file: Path,
    start_profile: Callable[[], None] | None,
) -> tuple[dict[bool, dict[str, list[tuple[float, float]]]], dict[bool, dict[str, float]]]:
    """`measure` non-streamed, then streamed (`start_profile` called at the end of the first
    warm-up): streamed → target → timings, and streamed → target (of `pids`) → microseconds of
    CPU its process used per measured exchange."""
    runs, cpu = {}, {}
    for stream in (False, True):
        started: dict[str, float] = {}

        def warm(stream: bool = stream, started: dict[str, float] = started) -> None:
            if start_profile is not None and not stream:
                start_profile()
            started.update({name: cpu_seconds(at) for name, at in pids.items()})

        body = request_body(api_format, stream)
        runs[stream] = await measure(targets, PATHS[api_format], body, exchanges, ca_file, warm)
        cpu[stream] = {name: (cpu_seconds(at) - started[name]) / exchanges * 1e6 for name, at in pids.items()}
    return runs, cpu


def summarise(
    runs: dict[bool, dict[str, list[tuple[float, float]]]],
    cpu: dict[bool, dict[str, float]],
    exchanges: int,
    api_format: str,
    profile: Path | None,
) -> dict[str, Ratios]:
    """Print `main`'s `runs` (streamed → target → timings), its proxies' CPU per exchange (`cpu`:
    streamed → target → microseconds), the profile if taken; returns each mode's `goal_ratio`."""
    print(f"{exchanges} exchanges per target, {api_format}, after {WARMUP_EXCHANGES} warm-up exchanges\n")
    report("non-streamed", runs[False], 1, "total")
    report("streamed", runs[True], 1, "total")
    report("streamed", runs[True], 0, "first SSE byte")
    print("\nCPU per exchange (us, every thread of the process; the profiled one's includes cProfile)")
    for name in cpu[False]:
        print(f"  {name:<17}  non-streamed {cpu[False][name]:7.0f}  streamed {cpu[True][name]:7.0f}")
    print()
    ratios = {mode: goal_ratio(mode, runs[stream]) for mode, stream in MODES.items()}
    if profile is not None:
        print_profile(profile, exchanges)
    return ratios


MODES = {"non-streamed": False, "streamed": True}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=1000, help="measured exchanges per target and mode")
    parser.add_argument("--format", default="openai-chat", choices=sorted(PATHS), help="the API format")
    parser.add_argument(
        "--profile", type=Path, help="run the record proxy under cProfile, stats to this file"
    )
    parser.add_argument(
        "--baseline", metavar="PYTHON", help="also measure a recording proxy run by this interpreter"
    )
    parser.add_argument("--runs", type=int, default=1, help="measure this many times, then print the medians")
    parser.add_argument(
        "--replay-sizes",
        type=lambda text: [int(size) for size in text.split(",")],
        help=f"comma-separated recording lengths (each > {WARMUP_EXCHANGES}): measure only replay's scaling",
    )
    args = parser.parse_args()
    if args.replay_sizes:
        if min(args.replay_sizes) <= WARMUP_EXCHANGES:
            parser.error(f"--replay-sizes: every size must exceed the {WARMUP_EXCHANGES} warm-up exchanges")
        asyncio.run(replay_scaling(args.replay_sizes, args.exchanges, args.format))
    else:
        ratios = []
        for number in range(args.runs):
            if number:
                print(f"\n--- run {number + 1} of {args.runs}")
            ratios.append(asyncio.run(main(args.exchanges, args.format, args.profile, args.baseline)))
        if args.runs > 1:
            print_medians(ratios)
