"""gRPC's fork handlers stay out of the controller's children (`reroll.host.forking`): a child
forked while the controller's gRPC is active starts with one thread, not gRPC's restarted pool
(whose threads crashed such children with SIGSEGV before their exec)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from reroll.host import forking

pytestmark = pytest.mark.spawns

FORK_AFTER_GRPC = textwrap.dedent(
    """
    import asyncio, os, sys, tempfile
    if sys.argv[1] == "reroll":
        import reroll
    import grpc

    async def main():
        socket = f"unix:{tempfile.mkdtemp()}/echo.sock"

        async def echo(request, context):
            return request

        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(echo)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {"E": handler})])
        server.add_insecure_port(socket)
        await server.start()
        async with grpc.aio.insecure_channel(socket) as channel:
            await channel.unary_unary("/t.T/E")(b"ping")
            read, write = os.pipe()
            pid = os.fork()  # as uvloop's uv_spawn does before the exec
            if pid == 0:
                os.write(write, str(len(os.listdir("/proc/self/task"))).encode())
                os._exit(0)
            os.close(write)
            print(os.read(read, 100).decode())
            os.waitpid(pid, 0)
        await server.stop(None)

    asyncio.run(main())
    """
)


def _threads_in_forked_child(first: str) -> int:
    env = {name: value for name, value in os.environ.items() if name != forking.GRPC_FORK_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FORK_AFTER_GRPC, first],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


def test_a_child_forked_while_grpc_runs_has_no_grpc_threads_once_reroll_is_imported() -> None:
    assert _threads_in_forked_child("grpc-alone") > 1, (
        "premise: gRPC alone restarts its threads in a forked child (if no longer, forking.py is moot)"
    )
    assert _threads_in_forked_child("reroll") == 1


def test_grpc_loaded_before_reroll_is_named_in_a_warning() -> None:
    code = "import grpc, os; import reroll; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"
    env = {name: value for name, value in os.environ.items() if name != forking.GRPC_FORK_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    assert done.stdout.strip() == "false"
    assert "gRPC was loaded before reroll without GRPC_ENABLE_FORK_SUPPORT=false" in done.stderr
