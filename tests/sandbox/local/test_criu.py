"""CRIU in isolated local sandboxes: a process tree checkpointed in one sandbox goes on in another
with its memory, its pids and, for a request held in flight, a retry that reaches the new
sandbox's server at the address it remembers; the images stay out of the sandboxes' reach."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from reroll import conformance
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local import rootview
from reroll.sandbox.local.criu import (
    FIRST_TREE_PID,
    dump_tree,
    find_tree,
    raise_next_pid,
    restore_attached,
    restore_tree,
)
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.rootview import AGENT_ID
from reroll.tasks.task import Task

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
]

COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done"
"""A shell loop whose count lives in its memory: a restored copy goes on from the count dumped."""

CLIENT = r"""
import http.client, os, sys, time
secret = os.urandom(8).hex()  # in memory only
log = open("/tmp/client.log", "a", buffering=1)
step = 0
while step < 3:
    try:
        connection = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]))
        connection.request("POST", f"/step/{step}", body=secret.encode())
        log.write(f"{step} {connection.getresponse().read().decode()} {secret}\n")
        step += 1
    except OSError as exc:
        log.write(f"{step} retry {type(exc).__name__}\n")
        time.sleep(0.1)
"""
"""An HTTP client that retries a request whose connection broke (as the agents' LLM clients do)."""


@contextlib.asynccontextmanager
async def two_sandboxes(task: Task) -> AsyncIterator[tuple[IsolatedSandbox, IsolatedSandbox]]:
    first = IsolatedSandbox(sandbox_spec(task), "criu-original")
    second = IsolatedSandbox(sandbox_spec(task), "criu-restored")
    await asyncio.gather(first.start(), second.start())
    try:
        yield first, second
    finally:
        await asyncio.gather(first.stop(), second.stop())


async def _pid_of(sandbox: IsolatedSandbox, pattern: str) -> int:
    return int((await conformance.sh(sandbox, f"pgrep -o -f '{pattern}'")).split()[0])


async def test_a_tree_goes_on_in_another_sandbox_from_its_memory(task: Task, tmp_path: Path) -> None:
    images = tmp_path / "images"
    async with two_sandboxes(task) as (original, restored):
        await raise_next_pid(original)
        await conformance.sh(original, f"setsid sh -c '{COUNTER}' </dev/null >/dev/null 2>&1 &", user="agent")
        await asyncio.sleep(0.5)
        pid = await _pid_of(original, "while true")
        assert pid > FIRST_TREE_PID
        await dump_tree(original, pid, images)
        dumped = int(await conformance.sh(original, "cat /tmp/count"))
        info = images.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700), (
            "the images are not the host's root's alone"
        )
        assert await _pid_of(original, "while true") == pid, "--leave-running: the original goes on"

        await restore_tree(restored, images)
        await asyncio.sleep(0.5)
        count = int(await conformance.sh(restored, "cat /tmp/count"))  # no /tmp/count before: the loop's own
        assert count > dumped - 5, (
            f"the restored loop started over ({count}) instead of going on from {dumped}"
        )
        owner = await conformance.sh(restored, f"ps -o user= -p {pid}")
        assert owner.strip() == "agent", f"pid {pid} in the new sandbox: {owner!r}"


async def test_a_request_in_flight_is_sent_again_to_the_new_sandbox_s_server(
    task: Task, tmp_path: Path
) -> None:
    answered: dict[str, list[str]] = {"original": [], "restored": []}
    release = asyncio.Event()

    def server(name: str) -> object:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1].decode()
            answered[name].append(path)
            if name == "original":
                await release.wait()  # held, as the proxy holds step K
                writer.close()
                return
            body = f"{name}:{path}".encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
            writer.close()

        return handle

    async with two_sandboxes(task) as (original, restored):
        servers = []
        for name, sandbox in (("original", original), ("restored", restored)):
            servers.append(await asyncio.start_server(server(name), await sandbox.host_address(), 0))  # type: ignore[arg-type]
            await sandbox.allow_host_port(servers[-1].sockets[0].getsockname()[1])
        port, new_port = (s.sockets[0].getsockname()[1] for s in servers)
        address = await original.host_address()
        await original.put_file("/tmp/client.py", CLIENT.encode())
        await raise_next_pid(original)
        await conformance.sh(
            original,
            f"setsid python3 /tmp/client.py {address} {port} </dev/null >/dev/null 2>&1 &",
            user="agent",
        )
        for _ in range(100):
            if answered["original"]:
                break
            await asyncio.sleep(0.05)
        assert answered["original"] == ["/step/0"]
        dumped = await dump_tree(
            original, await _pid_of(original, "client.py"), tmp_path / "images", leave_running=False
        )
        # The file system goes with the processes (the checkpoint's other layers): here, the log.
        await restored.put_file("/tmp/client.log", await original.get_file("/tmp/client.log"))
        await conformance.sh(restored, "chown agent /tmp/client.log")
        await restored.alias_host_port(address, port, new_port)
        restored_run = await restore_tree(restored, tmp_path / "images")
        for _ in range(100):
            if len(answered["restored"]) == 3:
                break
            await asyncio.sleep(0.05)
        log = await conformance.sh(restored, "cat /tmp/client.log")
        release.set()
        for server_ in servers:
            server_.close()
            await server_.wait_closed()
    assert answered["restored"] == ["/step/0", "/step/1", "/step/2"], log
    secrets = {line.split()[-1] for line in log.splitlines() if "restored:" in line}
    assert len(secrets) == 1, f"the client's memory was not kept: {log}"
    assert "0 retry" in log, log
    print(f"dump {dumped.seconds:.3f} s, restore {restored_run.seconds:.3f} s")
    assert os.stat(tmp_path / "images").st_uid == 0


async def test_a_tree_restored_attached_writes_to_the_restore_s_output(task: Task, tmp_path: Path) -> None:
    """The tree's stdout and stderr, pipes to the first sandbox's sidecar, are handed the restore's
    own (``--inherit-fd``): what it writes after the restore streams back, in order, and the
    restore returns when its root exits."""
    loop = "i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo out$i; echo err$i >&2; sleep 0.05; done"
    async with two_sandboxes(task) as (original, restored):
        await raise_next_pid(original)
        running = asyncio.create_task(original.exec(["sh", "-c", loop], user="agent"))
        await asyncio.sleep(0.5)
        tree = find_tree(original, original.id_base + AGENT_ID)
        assert tree.root >= FIRST_TREE_PID and set(tree.pipes) == {1, 2}
        await dump_tree(original, tree.root, tmp_path / "images", leave_running=False)
        before = (await running).stdout.decode().split()
        said: dict[str, bytes] = {"stdout": b"", "stderr": b""}

        def collect(stream: str, chunk: bytes) -> None:
            said[stream] += chunk

        code, timed_out = await restore_attached(restored, tmp_path / "images", tree.pipes, collect, 30)
    after = said["stdout"].decode().split()
    assert not timed_out and code == 0
    assert after and after[-1] == "out30" and int(after[0][3:]) >= int(before[-1][3:]), (before, after)
    assert said["stderr"].decode().split()[-1] == "err30"
