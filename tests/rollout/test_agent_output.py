"""Red team: an agent that prints 1 GiB. The controller streams its output into the run folder's
agent log, capped at `AGENT_LOG_MAX_BYTES` with a note line, and keeps only a short tail in memory:
the ``reroll run`` process's resident memory stays far below the output's size (measured by
sampling its RSS with psutil while it runs), and the rollout itself ends as usual (the verifier
scores the file the agent also wrote)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from reroll.runfolder.agent_log import AGENT_LOG, AGENT_LOG_MAX_BYTES, CUT_NOTE

pytestmark = [pytest.mark.spawns, pytest.mark.timeout(300)]
REROLL = str(Path(sys.executable).parent / "reroll")
GIB = 1024**3
RSS_CEILING_BYTES = 400 * 1024**2
"""Far below the 1 GiB printed (the controller's own RSS is about 100-150 MiB)."""
AGENTS = f"""
loud:
  description: prints 1 GiB, then solves hello-file
  api_format: none
  launch: "yes | head -c {GIB} && echo 'Hello, reroll!' > hello.txt && echo done >&2"
"""


class PeakRss:
    """Samples the RSS of process `pid` every 20 ms in a thread until `stop`; `peak` in bytes."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.02):
            try:
                rss = self.process.memory_info().rss
            except psutil.NoSuchProcess:
                return
            self.peak, self.samples = max(self.peak, rss), self.samples + 1

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def test_an_agent_printing_a_gibibyte_leaves_a_capped_log_and_a_bounded_controller(
    tmp_path: Path, examples: Path
) -> None:
    (tmp_path / "agents.yaml").write_text(AGENTS)
    env = {**os.environ, "REROLL_AGENTS_FILE": str(tmp_path / "agents.yaml")}
    started = time.monotonic()
    controller = subprocess.Popen(
        [REROLL, "run", str(examples / "hello-file"), "--agent", "loud", "--jobs-dir", "jobs",
         "--job-name", "j"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    rss = PeakRss(controller.pid)
    try:
        output, _ = controller.communicate(timeout=240)
    finally:
        rss.stop()
        controller.kill()
    elapsed = time.monotonic() - started
    print(f"peak RSS {rss.peak / 1024**2:.0f} MiB over {rss.samples} samples, {elapsed:.1f} s")
    assert controller.returncode == 0, output.decode(errors="replace")
    (run,) = (tmp_path / "jobs" / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert (result["status"], result["rewards"]) == ("ok", {"reward": 1.0}), result
    log = run / AGENT_LOG
    assert AGENT_LOG_MAX_BYTES < log.stat().st_size < AGENT_LOG_MAX_BYTES + 200
    with log.open("rb") as file:
        assert file.read(4) == b"y\ny\n"
        file.seek(AGENT_LOG_MAX_BYTES)
        note = file.read().decode()
    dropped = GIB + len("done\n") - AGENT_LOG_MAX_BYTES
    cut = f"keeps the first {AGENT_LOG_MAX_BYTES} bytes; {dropped} more bytes of this turn were dropped"
    assert note == f"\n{CUT_NOTE} {AGENT_LOG} {cut}\n"
    assert rss.samples > 10 and rss.peak < RSS_CEILING_BYTES, f"peak RSS {rss.peak / 1024**2:.0f} MiB"
