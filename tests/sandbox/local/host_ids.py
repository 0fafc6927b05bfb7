"""Host-side views of a local sandbox's processes for the identity tests: a process's host uids,
a command run as another host user, and the host pid of a process of the sandbox."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path


def uids(pid: int) -> list[int]:
    """The real, effective, saved and file system uids of host process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return [int(value) for value in next(line for line in status if line.startswith("Uid:")).split()[1:]]


def as_user(uid: int, *argv: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run `argv` on the host as `uid` (and gid), no supplementary groups, no capabilities; after
    `prefix` (run as root first, e.g. ``nsenter --ipc=...``)."""
    command = [*prefix, "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def host_pid(init_pid: int, inner: int) -> int:
    """The host pid of the process `inner` of the PID namespace whose init is `init_pid`.

    Raises:
        AssertionError: no such process.
    """
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, StopIteration):
            if os.readlink(entry / "ns/pid") != namespace:
                continue
            ns_pids = next(
                line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid")
            )
            if int(ns_pids.split()[-1]) == inner:
                return int(entry.name)
    raise AssertionError(f"no process {inner} in the sandbox")
