"""The controller's child processes start whole: gRPC's fork handlers are kept off in it.

Why: the controller runs on uvloop (`reroll.cli.common.run_coroutine`), whose subprocesses are
libuv's ``uv_spawn``: a plain ``fork()`` then ``exec`` (not ``vfork`` or ``posix_spawn`` as
CPython's own `subprocess` does), so every ``pthread_atfork`` handler of the process runs in the
child before it execs. grpcio's (1.85, on by default in its wheels) restart its EventEngine
thread pool in the child; while the controller's own gRPC threads are busy with hundreds of
sidecar connections, those threads crash the child with SIGSEGV before its ``exec`` (the kernel
logs ``event_engine[PID]: segfault at 37 ... in cygrpc.cpython-311-x86_64-linux-gnu.so``), and
the controller logs ``fork_posix.cc:71] Other threads are currently calling into gRPC, skipping
fork() handlers`` for such forks. The crashed child was whatever was being started: ``pasta``
(reported as pasta's exit -11, though pasta never ran) or the sidecar's ``setpriv``/``bwrap``
chain (reported as ``bwrap reported no child pid``). Measured on a 2-core machine: 177 of 408
sandbox starts of a 256-rollout ``scripts/bench/scale.py`` job failed so (25 rollouts still
failed after two retries), and 13 of 1,048 ``true`` children that uvloop spawned while 32 gRPC
calls looped in the same process died of SIGSEGV (none with the variable set).

The handlers are off when ``GRPC_ENABLE_FORK_SUPPORT=false`` is in the environment before gRPC
loads: `keep_grpc_out_of_forks` sets it when the ``reroll`` package is imported (gRPC is loaded
only by `reroll.sandbox.sidecar_client`, later). reroll's children only exec, they need none of
gRPC's state. The sidecar does the same for its children (``reroll_sidecar.__main__``). A Ray
worker loads gRPC before reroll, but runs its rollout on asyncio's own loop
(`reroll.jobs.ray_executor`), whose children CPython's `subprocess` starts with ``vfork``, which
runs no fork handlers.
"""

from __future__ import annotations

import os
import sys

from reroll.host.notices import warn_once

GRPC_FORK_VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"
"""The variable that, ``false`` before gRPC loads, keeps gRPC's fork handlers off in a process."""


def keep_grpc_out_of_forks() -> None:
    """Set `GRPC_FORK_VARIABLE` to ``false`` in this process's environment (its children
    inherit it too).

    If gRPC is loaded already without it, the handlers stay registered in this process (gRPC
    reads the variable when it loads): say so once, as a warning naming the variable.
    """
    if "grpc" in sys.modules and os.environ.get(GRPC_FORK_VARIABLE) != "false":
        _warn_loaded_once()
    os.environ[GRPC_FORK_VARIABLE] = "false"


def _warn_loaded_once() -> None:
    warn_once(
        f"reroll: gRPC was loaded before reroll without {GRPC_FORK_VARIABLE}=false in the environment: child "
        "processes started while gRPC calls run may crash before they start (SIGSEGV); set it "
        "before the process starts"
    )
