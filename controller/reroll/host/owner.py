"""Which controller process made something: a label naming this process (host, pid, start time)
and whether the process a label names still runs.

The docker backend labels its containers and disks with it (`reroll.sandbox.docker.engine.OWNER_LABEL`),
the local one its disks (`reroll.sandbox.local.storage`); neither needs the docker SDK for it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def owner_label(pid: int | None = None) -> str:
    """``<host name>/<pid>/<start time in clock ticks>`` naming process `pid` (default: this one)
    on this host (the start time tells a reused pid apart)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{pid}/{_start_ticks(pid)}"


def _start_ticks(pid: int) -> str:
    """Field 22 of ``/proc/<pid>/stat`` (start time since boot, clock ticks); "" if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


def owner_runs(owner: str | None) -> bool:
    """Whether the controller named by an `owner_label` value still runs (another host's: assumed so)."""
    if not owner:
        return False  # no owner label: a container from before labels had owners
    host, _, process = owner.partition("/")
    if host != socket.gethostname():
        return True
    pid, _, ticks = process.partition("/")
    return pid.isdigit() and ticks != "" and _start_ticks(int(pid)) == ticks
