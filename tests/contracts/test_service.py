"""A host-side service process: the base URL it announces, its ready file, and its run loop
stopped by SIGTERM with its cleanup run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reroll_contracts.proxy import ReadyFile
from reroll_contracts.service import base_url_for, write_ready_file


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8080/v1"),
        ("0.0.0.0", "http://127.0.0.1:8080/v1"),
        ("", "http://127.0.0.1:8080/v1"),
        ("::", "http://[::1]:8080/v1"),
        ("fd00::2", "http://[fd00::2]:8080/v1"),
        ("proxy.local", "http://proxy.local:8080/v1"),
    ],
)
def test_a_wildcard_is_announced_as_loopback_and_ipv6_in_brackets(host: str, url: str) -> None:
    assert base_url_for(host, 8080) == url


def test_the_ready_file_is_written_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "ready.json"
    written = write_ready_file(path, "0.0.0.0", 4000)
    assert written == ReadyFile(pid=os.getpid(), address="http://127.0.0.1:4000/v1")
    assert ReadyFile.model_validate_json(path.read_text()) == written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready.json"]


SERVICE = """
import asyncio, sys
from pathlib import Path
from reroll_contracts.service import run_service

async def main() -> None:
    Path(sys.argv[1]).write_text("started")
    try:
        await asyncio.sleep(60)
    finally:
        Path(sys.argv[1]).write_text("cleaned up")

run_service(main)
"""


@pytest.mark.spawns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_cancels_the_service_which_cleans_up_and_exits_0(tmp_path: Path, signum: int) -> None:
    marker = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", SERVICE, str(marker)])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text() == "started"
        child.send_signal(signum)
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()
    assert marker.read_text() == "cleaned up"
