"""Benchmark: what the LLM proxy adds to an exchange, against a direct call to the same upstream.

The upstream is the bundled scripted model (a local subprocess), the proxy a real
``python -m reroll_proxy`` subprocess. For each exchange the client (aiohttp, one keep-alive
connection per target) calls the upstream directly and then through the proxy, alternating,
so both see the same machine load. Measured per exchange, in milliseconds:

- ``total``: request sent -> whole response read (non-streamed and streamed requests);
- ``ttfb``: request sent -> first byte of the response body (streamed requests: the first SSE
  bytes, which the proxy forwards before the stream ends).

Four targets: ``direct``; ``record`` (the proxy forwards to the upstream and fsyncs every
exchange to its trajectory); ``record-nofsync`` (the same with ``fsync_each_exchange: false``:
lines only flushed to the OS, which shows what the disk costs); ``replay`` (a proxy replays the
``record`` trajectory with no upstream: the divergence check runs on every request, each
replayed exchange is fsynced to its own trajectory). The figures printed are p50 / p95 of
each target, the added p50 / p95 (proxy minus direct) and their ratio.

Run: ``.venv/bin/python scripts/bench/proxy.py [--exchanges 1000] [--format openai-chat]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from reroll.processes import ChildProcess

TOKEN = "bench-token"
WARMUP_EXCHANGES = 50
ANSWER = "I'll look at the repository first, then run the tests and fix what fails. " * 3
SCRIPT = {
    "turns": [{"content": ANSWER, "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]}]
}
TOOLS = [
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


async def exchange(session: aiohttp.ClientSession, url: str, payload: bytes) -> tuple[float, float]:
    """One request: (ttfb, total) in milliseconds."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    started = time.perf_counter()
    async with session.post(url, data=payload, headers=headers) as response:
        first = await response.content.readany()
        ttfb = time.perf_counter() - started
        rest = await response.read() if first else b""
        total = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {(first + rest)[:300]!r}")
    return ttfb * 1000, total * 1000


async def measure(
    targets: dict[str, str], path: str, body: dict[str, Any], count: int
) -> dict[str, list[tuple[float, float]]]:
    """`count` exchanges per target, alternating targets per exchange (after a warm-up)."""
    payload = orjson.dumps(body)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    sessions = {name: aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) for name in targets}
    try:
        for number in range(WARMUP_EXCHANGES + count):
            for name, base_url in targets.items():
                timing = await exchange(sessions[name], base_url + path, payload)
                if number >= WARMUP_EXCHANGES:
                    results[name].append(timing)
    finally:
        for session in sessions.values():
            await session.close()
    return results


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
        print(f"  {name:<14}         {p50:7.3f}  {p95:7.3f}  {added}")


async def main(exchanges: int, api_format: str) -> None:
    with tempfile.TemporaryDirectory(prefix="reroll-bench-") as folder:
        work = Path(folder)
        (work / "script.json").write_bytes(orjson.dumps(SCRIPT))
        trajectory = work / "record.jsonl"
        record_config: dict[str, Any] = {"token": TOKEN, "trajectory_path": str(trajectory)}
        async with ChildProcess(
            "reroll.scripted_model", ["--script", str(work / "script.json")], workdir=work, name="model"
        ) as model:
            record_config["upstream"] = {"base_url": model.ready["base_url"]}
            nofsync_config = record_config | {
                "trajectory_path": str(work / "nofsync.jsonl"),
                "fsync_each_exchange": False,
            }
            (work / "record.json").write_bytes(orjson.dumps(record_config))
            (work / "nofsync.json").write_bytes(orjson.dumps(nofsync_config))
            async with (
                ChildProcess(
                    "reroll_proxy", ["--config", str(work / "record.json")], workdir=work, name="record"
                ) as proxy,
                ChildProcess(
                    "reroll_proxy", ["--config", str(work / "nofsync.json")], workdir=work, name="nofsync"
                ) as nofsync,
            ):
                targets = {
                    "direct": model.ready["base_url"],
                    "record": proxy.ready["base_url"],
                    "record-nofsync": nofsync.ready["base_url"],
                }
                runs = {
                    stream: await measure(
                        targets, PATHS[api_format], request_body(api_format, stream), exchanges
                    )
                    for stream in (False, True)
                }
        replay_config = {
            "token": TOKEN,
            "trajectory_path": str(work / "replay.jsonl"),
            "replay_path": str(trajectory),
        }
        (work / "replay.json").write_bytes(orjson.dumps(replay_config))
        async with ChildProcess(
            "reroll_proxy", ["--config", str(work / "replay.json")], workdir=work, name="replay"
        ) as replay:
            for stream in (False, True):
                body = request_body(api_format, stream)
                # The replay proxy serves the recording in order: warm-up and measured exchanges alike.
                replayed = await measure(
                    {"replay": replay.ready["base_url"]}, PATHS[api_format], body, exchanges
                )
                runs[stream]["replay"] = replayed["replay"]
    print(f"{exchanges} exchanges per target, {api_format}, after {WARMUP_EXCHANGES} warm-up exchanges\n")
    report("non-streamed", runs[False], 1, "total")
    report("streamed", runs[True], 1, "total")
    report("streamed", runs[True], 0, "first SSE byte")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=1000, help="measured exchanges per target and mode")
    parser.add_argument("--format", default="openai-chat", choices=sorted(PATHS), help="the API format")
    args = parser.parse_args()
    asyncio.run(main(args.exchanges, args.format))
