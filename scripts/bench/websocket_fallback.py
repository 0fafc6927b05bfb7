"""Benchmark: Codex CLI as a WebSocket-first client, against the proxy's immediate refusal (426).

Codex's built-in OpenAI provider (here: the custom provider with ``supports_websockets = true``)
opens ``GET /v1/responses`` with ``Upgrade: websocket`` before any HTTP request. Three targets,
each a one-turn ``codex exec`` ("Say done.") run end to end, alternated ``--runs`` times:

- ``http``: a proxy, and Codex without WebSocket support (the baseline);
- ``refused``: the same proxy, Codex trying the WebSocket first: refused with 426, it falls back
  to HTTP at once (`reroll_proxy.endpoints_websocket`);
- ``404``: Codex trying the WebSocket first against a server that answers the upgrade 404 (and
  forwards POSTs to the proxy): what a refusal that Codex takes as transient costs.

Printed: the median wall time of each, in seconds, and its ratio to ``http``. The codex binary
is the one in reroll's agent cache (run ``reroll run … --agent codex`` once) or ``--codex PATH``.

Run: ``.venv/bin/python scripts/bench/websocket_fallback.py [--runs 3] [--codex PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web
from reroll.agents import get_agent
from reroll.cache import cache_dir
from reroll.host.child_process import ChildProcess
from reroll_contracts.proxy import ProxyConfig, UpstreamConfig

TOKEN = "bench-token"


@asynccontextmanager
async def refusing_404(target: str) -> AsyncIterator[str]:
    """A server answering GETs 404 and forwarding POSTs to `target` (``http://HOST:PORT``); its URL."""

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=404)
        async with aiohttp.ClientSession() as session:
            headers = {
                "Authorization": request.headers.get("Authorization", ""),
                "Content-Type": "application/json",
            }
            async with session.post(
                target + request.path, data=await request.read(), headers=headers
            ) as answer:
                response = web.StreamResponse(
                    status=answer.status, headers={"Content-Type": answer.content_type}
                )
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                with contextlib.suppress(ConnectionResetError):  # codex hangs up after the last event
                    await response.write_eof()
                return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def run_codex(codex: Path, base_url: str, websockets: bool, work: Path) -> float:
    """One ``codex exec`` run to its end; its wall time in seconds."""
    home = Path(tempfile.mkdtemp(prefix="codex-home-", dir=work))
    args = [
        "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
        "--disable", "plugins", "-c", "analytics.enabled=false", "-c", "model_provider=reroll",
        "-c", "model_providers.reroll.name=reroll", "-c", f"model_providers.reroll.base_url={base_url}",
        "-c", "model_providers.reroll.env_key=BENCH_KEY", "-c", "model_providers.reroll.wire_api=responses",
        "-c", f"model_providers.reroll.supports_websockets={str(websockets).lower()}",
        "-m", "scripted", "Say done.",
    ]  # fmt: skip
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(codex), *args, cwd=work, env={**os.environ, "CODEX_HOME": str(home), "BENCH_KEY": TOKEN},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0 or b'"Done."' not in out:
        raise SystemExit(f"codex failed ({process.returncode}):\n{err.decode()[-2000:]}")
    return time.monotonic() - started


async def main(runs: int, codex: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="reroll-bench-ws-") as folder:
        work = Path(folder)
        (work / "script.json").write_bytes(orjson.dumps({"turns": [{"content": "Done."}]}))
        async with ChildProcess(
            "reroll_proxy.scripted", ["--script", str(work / "script.json")], workdir=work, name="model"
        ) as model:
            config = ProxyConfig(
                token=TOKEN,
                trajectory_path=work / "trajectory.jsonl",
                upstream=UpstreamConfig(base_url=model.ready.address),
            )
            (work / "proxy.json").write_text(config.model_dump_json())
            async with (
                ChildProcess(
                    "reroll_proxy", ["--config", str(work / "proxy.json")], workdir=work, name="proxy"
                ) as proxy,
                refusing_404(proxy.ready.address.removesuffix("/v1")) as plain,
            ):
                targets = {
                    "http": (proxy.ready.address, False),
                    "refused": (proxy.ready.address, True),
                    "404": (plain + "/v1", True),
                }
                times: dict[str, list[float]] = {name: [] for name in targets}
                for _ in range(runs):
                    for name, (url, websockets) in targets.items():
                        times[name].append(await run_codex(codex, url, websockets, work))
    base = statistics.median(times["http"])
    print(f"codex exec, one turn, median of {runs} runs (seconds; ratio to http)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:>8}: {median:6.2f} s  x{median / base:4.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per target")
    default = cache_dir() / "agents" / get_agent("codex").install_key / "venv" / "bin" / "codex"
    parser.add_argument("--codex", type=Path, default=default, help="the codex binary")
    arguments = parser.parse_args()
    if not arguments.codex.is_file():
        sys.exit(
            f"{arguments.codex}: no codex binary; run `reroll run … --agent codex` once, or pass --codex"
        )
    asyncio.run(main(arguments.runs, arguments.codex))
