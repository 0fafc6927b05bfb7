"""``reroll branch`` starts the shared LLM proxy (the scripted model's server too) first, before its
flags are checked and its implementation imported (its start overlaps that), and a command that
stops before its branches run leaves neither process nor folder behind."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest
from reroll.cli.app import app
from reroll.host import shared_process
from reroll.host.child_process import ChildProcess
from typer.testing import CliRunner

pytestmark = [
    pytest.mark.spawns,  # the proxy, for real
    pytest.mark.skipif(sys.platform != "linux", reason="reads /proc"),
]


def test_a_bad_flag_stops_the_process_started_before_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(shared_process.MODE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where their folders go
    started: list[ChildProcess] = []
    start = ChildProcess.start

    async def recorded(self: ChildProcess, *args: object, **kwargs: object) -> object:
        started.append(self)
        return await start(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ChildProcess, "start", recorded)
    script = tmp_path / "script.yaml"
    argv = ["branch", str(tmp_path / "run"), "--at", "1", "--model", f"scripted:{script}"]
    done = CliRunner().invoke(app, [*argv, "--fault-seed", "7"])  # --fault-seed without --faults
    assert done.exit_code == 2, done.output
    assert [child.module for child in started] == ["reroll_proxy"]  # one process: the scripted model's too
    assert all(child.pid is not None and not Path(f"/proc/{child.pid}").exists() for child in started)
    assert list(tmp_path.glob("reroll-*")) == []  # its folder removed
