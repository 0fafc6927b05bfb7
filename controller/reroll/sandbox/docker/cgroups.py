"""What the kernel says of a container's limits: the OOM killer's count in its memory cgroup."""

from __future__ import annotations

import contextlib
from pathlib import Path


def oom_kills(pid: int) -> int:
    """How many processes the OOM killer ended in the memory cgroup of host process `pid` (the
    container's init); 0 when unknown. Reads ``oom_kill`` of cgroup v1's ``memory.oom_control``
    or cgroup v2's ``memory.events`` (Linux's Documentation/admin-guide/cgroup-v{1,2})."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines() if pid > 0 else []
    except OSError:
        return 0
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            counters = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control")
        elif controllers == "":
            counters = Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events")
        else:
            continue
        with contextlib.suppress(OSError, ValueError):
            for counter in counters.read_text().splitlines():
                name, _, value = counter.partition(" ")
                if name == "oom_kill":
                    return int(value)
    return 0
