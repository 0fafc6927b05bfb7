"""The owner label of a controller process and whether the process it names still runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from reroll.host.owner import owner_label, owner_runs


def test_this_process_runs_and_a_reused_pid_does_not() -> None:
    """This process's label names a running owner; the same pid with another start time (a pid
    reused after its owner ended) does not; nor does an empty label."""
    label = owner_label()
    host, pid, ticks = label.split("/")
    assert (host, pid) == (socket.gethostname(), str(os.getpid())) and ticks.isdigit()
    assert owner_runs(label)
    assert not owner_runs(f"{host}/{pid}/{int(ticks) + 1}")
    assert not owner_runs("") and not owner_runs(None)


@pytest.mark.spawns
def test_an_ended_process_does_not_run_and_another_hosts_is_assumed_to() -> None:
    """A process that ended no longer owns anything; another host's owner cannot be checked from
    here, so it is assumed to run."""
    code = "import os; print(os.getpid())"
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert owner_label(int(ended.stdout)).endswith("/")  # no such process: no start time
    assert not owner_runs(owner_label(int(ended.stdout)))
    assert owner_runs("another-host.example/1/1")
