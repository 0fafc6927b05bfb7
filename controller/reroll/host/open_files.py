"""How many files the controller may hold open (``RLIMIT_NOFILE``), raised and checked before a job.

Each rollout running in the controller's process holds files open for as long as it runs: its
``harness/controller.log`` and the agent's ``output.log``, the sidecar's gRPC connection, the
listening sockets forwarded into its network namespace, and two sockets per LLM exchange in
flight (measured: 4.6 per rollout at 256 rollouts, ``scripts/bench/scale.py``). Linux's default
soft limit is often 1024 (its hard limit much higher): about 200 rollouts, after which opening a
log or accepting a connection fails with ``EMFILE`` in whichever rollout comes next.

`open_files_for` raises the soft limit to the hard one (no privilege needed; the children
inherit it, as a Docker container's processes get 1048576) and refuses, with a message naming the
limit and the numbers, a concurrency the hard limit cannot hold.
"""

from __future__ import annotations

import contextlib
import resource

from reroll_contracts.errors import JobError

FILES_PER_ROLLOUT = 8
"""Open files counted for one running rollout: the 4.6 measured, and exchanges in flight."""
FILES_BASE = 256
"""Open files counted for the controller itself (its interpreter, libraries, event loop, logs)."""


def open_files_for(rollouts: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit and check it holds `rollouts`
    running at once (`FILES_BASE` + `FILES_PER_ROLLOUT` per rollout).

    Returns:
        The soft limit now in force (open files).

    Raises:
        JobError: the hard limit is below what `rollouts` need; the message names the limit, both
            numbers and how to raise it.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit above fs.nr_open
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    needed = FILES_BASE + FILES_PER_ROLLOUT * rollouts
    if soft != resource.RLIM_INFINITY and soft < needed:
        most = max(0, (soft - FILES_BASE) // FILES_PER_ROLLOUT)
        raise JobError(
            f"{rollouts} rollouts at once need about {needed} open files in the controller, and "
            f"its limit of open files (RLIMIT_NOFILE, ulimit -n) is {soft} (the hard limit): raise "
            f"it (ulimit -Hn {needed}, or LimitNOFILE= in a systemd unit) or run at most {most} "
            "at once (--concurrency)"
        )
    return soft
