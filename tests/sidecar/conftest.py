"""Fixtures that run the real sidecar as a subprocess and connect the real client to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.sidecar_client import SidecarClient
from reroll_contracts.proxy import ReadyFile

from tests.conftest import spawning

READY_TIMEOUT_SECONDS = 20.0
MARKER_ENV = "SIDECAR_TEST_MARKER"
"""Set in every test sidecar's environment, to check what its children inherit."""


@dataclass
class RunningSidecar:
    """A sidecar subprocess started by `start_sidecar`."""

    address: str
    """The address from its ready file."""
    token: str
    process: subprocess.Popen[bytes]
    ready: dict[str, object]
    """Its ready file's content."""
    log_path: Path

    def stop(self) -> int:
        """SIGTERM the sidecar and wait for it (SIGKILL after 10 s); return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class StartSidecar(Protocol):
    """Starts a sidecar listening on `listen` (``{dir}`` stands for a short temp folder)."""

    def __call__(self, listen: str, token: str = "") -> Awaitable[RunningSidecar]: ...


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="rr-sc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
@spawning
async def start_sidecar(short_dir: Path) -> AsyncIterator[StartSidecar]:
    """A `StartSidecar` function (token: random when empty); every sidecar it started stops after the test."""
    started: list[RunningSidecar] = []

    async def start(listen: str, token: str = "") -> RunningSidecar:
        index = len(started)
        ready_file = short_dir / f"ready{index}.json"
        log_path = short_dir / f"sidecar{index}.log"
        token = token or secrets.token_urlsafe(16)
        env = dict(os.environ, REROLL_SIDECAR_TOKEN=token, **{MARKER_ENV: "from-sidecar"})
        argv = [sys.executable, "-m", "reroll_sidecar", "--listen", listen.format(dir=short_dir)]
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*argv, "--ready-file", str(ready_file)], env=env, stdout=log, stderr=log
            )
        sidecar = RunningSidecar("", token, process, {}, log_path)
        started.append(sidecar)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not ready_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sidecar did not start (exit {process.poll()}):\n{log_path.read_text()}")
            await asyncio.sleep(0.02)
        ready = ReadyFile.model_validate_json(ready_file.read_bytes())  # what the controller reads
        sidecar.ready, sidecar.address = ready.model_dump(), ready.address
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop()


@pytest.fixture
async def sidecar(start_sidecar: StartSidecar) -> RunningSidecar:
    """A sidecar listening on a unix socket."""
    return await start_sidecar("unix:{dir}/s.sock")


HOST_LAYOUT = SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/root", agents_dir="/agents")
"""The layout a bare sidecar's client gets; a test that prepares a verify sets its own."""


@contextlib.asynccontextmanager
async def connected(address: str, token: str) -> AsyncIterator[SidecarClient]:
    """A client of the sidecar at `address` with `token` (not waited on), disconnected at the end."""
    client = SidecarClient(HOST_LAYOUT, f"sidecar at {address}")
    await client.connect(address, token)
    try:
        yield client
    finally:
        await client.disconnect()


@pytest.fixture
async def client(sidecar: RunningSidecar) -> AsyncIterator[SidecarClient]:
    """A client connected to `sidecar`, ready."""
    async with connected(sidecar.address, sidecar.token) as ready:
        await ready.wait_ready(timeout_seconds=10)
        yield ready
