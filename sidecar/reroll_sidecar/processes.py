"""The processes the sidecar runs: spawn one in its own session, stream its output, kill groups.

Every child of `run` leads a new session, hence its own process group, which `ProcessGroups`
remembers (with the user it runs as) until the group is killed or has died out, so `Kill` also
reaches what a finished command left running in the background. On timeout or when the
consumer stops early the whole group gets SIGKILL.

A task's service (``ExecRequest.service``) is remembered as such, by its pid and its start time
(`quiesce.Identity`, taken from the kernel as it is spawned, so a reused pid is never mistaken
for it): `ProcessGroups.kill` of one user and the quiesce of the agent spare it and everything
it forks (`ProcessGroups.services`); only a kill of every user stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pwd
import signal
import subprocess
import threading
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass

from reroll_protos.sidecar.v1 import sidecar_pb2 as pb

from reroll_sidecar import quiesce

CHUNK_BYTES = 64 * 1024
"""The largest output chunk sent in one event."""
PIPE_GRACE_SECONDS = 2.0
"""How long output is still read after the child exited, while its background processes hold the pipes."""


def user_name(uid: int) -> str:
    """The name of user `uid`, or the number as text when the user has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass(frozen=True)
class Command:
    """One validated Exec request."""

    argv: list[str]
    cwd: str | None
    env: dict[str, str]
    user: str
    """The user the child runs as (a name, never empty)."""
    switch_to: pwd.struct_passwd | None
    """The passwd entry to switch to, or None to run as the sidecar's own user."""
    timeout_seconds: float
    """0 = no timeout."""
    stdin: bytes
    service: bool = False
    """A task's service: spared by the agent's quiesce (see the module docstring)."""


class ProcessGroups:
    """The process groups started through Exec that may still be alive, with their users."""

    def __init__(self) -> None:
        self._users: dict[int, str] = {}
        self._services: dict[int, quiesce.Identity] = {}
        self.waited: set[int] = set()
        """The children a thread of `run` waits for (never reaped elsewhere)."""

    def add(self, pgid: int, user: str, service: bool = False) -> None:
        """Remember group `pgid` (its leader, a child of the sidecar), run as `user`, as a task's
        service when `service` is set; forget groups that have died out."""
        for old in list(self._users):
            if not _signal_group(old, 0):
                del self._users[old]
                self._services.pop(old, None)
        self._users[pgid] = user
        if service and (identity := quiesce.identity(pgid)) is not None:
            self._services[pgid] = identity

    def services(self) -> frozenset[quiesce.Identity]:
        """The service processes started through Exec (their leaders), as spawned."""
        return frozenset(self._services.values())

    def kill(self, user: str = "", *, services: bool = True) -> int:
        """SIGKILL every remembered group of `user` (empty: of every user) and forget them;
        `services` False spares the task's services' groups.

        Returns:
            How many groups still existed and were signalled.
        """
        killed = 0
        for pgid, owner in list(self._users.items()):
            if (user and owner != user) or (not services and pgid in self._services):
                continue
            del self._users[pgid]
            self._services.pop(pgid, None)
            killed += _signal_group(pgid, signal.SIGKILL)
        return killed


def _signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid` (0: only probe); False when the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def kill_user(groups: ProcessGroups, user: str, spare_services: bool = False) -> tuple[int, int]:
    """SIGKILL the Exec process groups of `user` (empty: of every user), then quiesce the agent's
    processes (`quiesce.quiesce`): what left those groups dies too.

    The agent's processes are, for an empty `user`, every descendant of the sidecar outside its
    session, the task's services included; when the sidecar is root and `user` is another,
    non-root user, every process of that user (a service runs as the sidecar's user: spared).
    `spare_services` (the agent's quiesce): both, but the services and what they forked
    (`ProcessGroups.services`) — so a process the agent made root (a setuid program) dies too.

    Returns:
        ``(groups signalled, other processes killed)``.

    Raises:
        KeyError: `user` has no passwd entry (checked only when the sidecar is root).
        QuiesceError: the processes were not all gone within the time limit.
    """
    uid: int | None = None
    if user and os.geteuid() == 0:
        uid = pwd.getpwnam(user).pw_uid
        if uid in (0, os.geteuid()):
            uid = None
    if spare_services:
        spare = groups.services()
        killed_groups = groups.kill(user, services=False)
        selection = quiesce.Selection(uid=uid, descendants=True, spare=spare)
        return killed_groups, quiesce.quiesce(selection, keep_reaped=groups.waited)
    killed_groups = groups.kill(user)
    killed_processes = 0
    if uid is not None or not user:
        selection = quiesce.Selection(uid=uid, descendants=not user)
        killed_processes = quiesce.quiesce(selection, keep_reaped=groups.waited)
    return killed_groups, killed_processes


def child_env(inherit: bool, overrides: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: `overrides` alone, or the sidecar's own updated by them."""
    return {**os.environ, **overrides} if inherit else dict(overrides)


def _event(stream: str, data: bytes) -> pb.ExecEvent:
    return pb.ExecEvent(stdout=data) if stream == "stdout" else pb.ExecEvent(stderr=data)


def _spawn(command: Command) -> subprocess.Popen[bytes]:
    """Start the child in a new session, as `command.switch_to` when set. Raises OSError."""
    account = command.switch_to
    return subprocess.Popen(
        command.argv,
        cwd=command.cwd,
        env=command.env,
        stdin=subprocess.PIPE if command.stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        user=account.pw_uid if account else None,
        group=account.pw_gid if account else None,
        extra_groups=os.getgrouplist(account.pw_name, account.pw_gid) if account else None,
    )


def _wait_in_thread(process: subprocess.Popen[bytes], done: asyncio.Future[int], waited: set[int]) -> None:
    """Reap `process` on a thread of its own and resolve `done` with its exit code; `process`
    is in `waited` until reaped."""
    loop = done.get_loop()
    waited.add(process.pid)

    def resolve(code: int) -> None:
        if not done.done():
            done.set_result(code)

    def reap() -> None:
        code = process.wait()
        waited.discard(process.pid)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(resolve, code)

    threading.Thread(target=reap, name=f"reap-{process.pid}", daemon=True).start()


async def run(command: Command, groups: ProcessGroups) -> AsyncGenerator[pb.ExecEvent, None]:
    """Run `command` and yield its output as produced, then its exit as the last event.

    Output comes in chunks of at most `CHUNK_BYTES`; reading pauses while the consumer does not
    take events, so a slow client slows the child instead of filling memory. A program that
    cannot be started ends with exit code 127 (not found) or 126 (not executable) and the error
    on stderr. Closing the iterator before the end SIGKILLs the child's process group.
    """
    try:
        process = _spawn(command)
    except OSError as exc:
        yield pb.ExecEvent(stderr=f"reroll-sidecar: cannot execute {command.argv[0]!r}: {exc}\n".encode())
        yield pb.ExecEvent(exit=pb.ExecExit(exit_code=127 if isinstance(exc, FileNotFoundError) else 126))
        return
    groups.add(process.pid, command.user, command.service)
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()
    _wait_in_thread(process, exited, groups.waited)
    timed_out = False
    transports: list[asyncio.BaseTransport] = []
    timers: list[asyncio.TimerHandle] = []
    reads: dict[asyncio.Future[bytes], tuple[str, asyncio.StreamReader]] = {}

    def on_timeout() -> None:
        nonlocal timed_out
        if exited.done():
            return  # only background processes hold the pipes now; the grace period stops reading them
        timed_out = True
        _signal_group(process.pid, signal.SIGKILL)

    def stop_reading() -> None:
        for transport in transports:
            transport.close()  # the readers then see end of file

    def on_exit(_: asyncio.Future[int]) -> None:
        # Background processes may hold the pipes open: read on for a grace period only.
        timers.append(loop.call_later(PIPE_GRACE_SECONDS, stop_reading))

    finished = False
    try:
        if command.timeout_seconds > 0:
            timers.append(loop.call_later(command.timeout_seconds, on_timeout))
        exited.add_done_callback(on_exit)
        if process.stdin is not None:
            writer, _ = await loop.connect_write_pipe(asyncio.Protocol, process.stdin)
            writer.write(command.stdin)
            writer.close()  # closes the child's stdin once everything is written
            transports.append(writer)
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            reader = asyncio.StreamReader(limit=CHUNK_BYTES)
            transport, _ = await loop.connect_read_pipe(
                functools.partial(asyncio.StreamReaderProtocol, reader), pipe
            )
            transports.append(transport)
            reads[asyncio.ensure_future(reader.read(CHUNK_BYTES))] = (stream, reader)
        while reads:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
            for read in done:
                stream, reader = reads.pop(read)
                data = read.result()
                if data:
                    yield _event(stream, data)
                    reads[asyncio.ensure_future(reader.read(CHUNK_BYTES))] = (stream, reader)
        exit_code = await exited
        finished = True
        yield pb.ExecEvent(exit=pb.ExecExit(exit_code=exit_code, timed_out=timed_out))
    finally:
        exited.remove_done_callback(on_exit)
        for timer in timers:
            timer.cancel()
        for read in reads:
            read.cancel()
        if not finished:
            _signal_group(process.pid, signal.SIGKILL)
        stop_reading()
