"""A host-side service process (the LLM proxy, the scripted model server: ``python -m`` entry points).

- `base_url_for` is the URL clients use for a listening address.
- `write_ready_file` announces a listening server the way `reroll.host.child_process.ChildProcess`
  waits for: a `reroll_contracts.proxy.ReadyFile` written atomically (temp file + rename).
- `run_service` runs a server coroutine until SIGTERM / SIGINT, on uvloop when installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from reroll_contracts.proxy import ReadyFile


def base_url_for(host: str, port: int) -> str:
    """``http://HOST:PORT/v1`` for a server listening on `host` (a wildcard is announced as loopback)."""
    announced = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in announced:
        announced = f"[{announced}]"
    return f"http://{announced}:{port}/v1"


def write_ready_file(path: Path, host: str, port: int) -> ReadyFile:
    """Announce an HTTP server of this process: write its `ReadyFile` to `path` atomically.

    Args:
        path: the ready file (its folder must exist).
        host: the interface the server listens on.
        port: the TCP port it listens on.

    Returns:
        What was written; its ``address`` is `base_url_for` (host, port).
    """
    ready = ReadyFile(pid=os.getpid(), address=base_url_for(host, port))
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(ready.model_dump_json())
    os.replace(temporary, path)
    return ready


def run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` until it returns or the process gets SIGTERM / SIGINT (then cancel it).

    `main` should clean up in ``finally`` / ``async with``: cancellation is how it is told to stop.
    Uses uvloop when it is importable.
    """
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_until_signalled(main))


async def _until_signalled(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    task = asyncio.ensure_future(main())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
