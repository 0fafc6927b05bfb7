"""The sidecar's gRPC service (health, exec, files, kill, snapshots, verify) and the server that hosts it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import math
import os
import pwd
import signal
import stat
import tempfile
from collections.abc import AsyncIterator
from typing import BinaryIO, NoReturn

import grpc
from reroll_contracts.errors import QuiesceError, SidecarRequestError, SidecarRequestKind
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_protos.sidecar.v1 import sidecar_pb2_grpc as pb_grpc

from reroll_sidecar import __version__, manifest, processes, quiesce
from reroll_sidecar.auth import BearerTokenInterceptor
from reroll_sidecar.snapshots import SnapshotStore
from reroll_sidecar.verify import Verifier

FILE_CHUNK_BYTES = 1024 * 1024
"""The largest file chunk GetFile sends."""
MAX_GET_FILE_BYTES = 1024**3
"""The largest file GetFile sends whole (a request's ``max_bytes`` reads the start of a larger one)."""
DEFAULT_FILE_MODE = 0o644
STOP_GRACE_SECONDS = 1.0
MAX_REQUEST_BYTES = 64 * 1024 * 1024
"""The largest request message accepted, which bounds an Exec's stdin (gRPC's default: 4 MiB)."""

log = logging.getLogger(__name__)


async def _abort_os_error(
    context: grpc.aio.ServicerContext[object, object], path: str, exc: OSError
) -> NoReturn:
    """Fail the RPC with the status that matches `exc`, naming `path`."""
    code = {
        FileNotFoundError: grpc.StatusCode.NOT_FOUND,
        PermissionError: grpc.StatusCode.PERMISSION_DENIED,
    }.get(type(exc), grpc.StatusCode.FAILED_PRECONDITION)
    await context.abort(code, f"{path}: {exc.strerror or exc}")


def _open_regular(path: str, max_bytes: int) -> tuple[BinaryIO, int]:
    """Open `path` for GetFile as root may open a file the agent can write: never through a symlink
    (``O_NOFOLLOW``: the agent's ``reward.txt`` → ``/etc/shadow`` is not read), never waiting (a
    FIFO is opened ``O_NONBLOCK``, then refused with every other non-regular file).

    Returns:
        The open file and how many bytes to send: `max_bytes` (0: the whole file) bounded by the
        size it has now, so a file the agent keeps appending to ends the stream all the same.

    Raises:
        OSError: it cannot be opened (missing; a symlink: ELOOP; no permission).
        ValueError: not a regular file, or larger than `MAX_GET_FILE_BYTES` without `max_bytes`.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"not a regular file (mode {stat.filemode(info.st_mode)}); not read")
        if not max_bytes and info.st_size > MAX_GET_FILE_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than the cap of {MAX_GET_FILE_BYTES} bytes")
    except BaseException:
        handle.close()
        raise
    return handle, min(info.st_size, max_bytes) if max_bytes else info.st_size


async def _receive_file(path: str, mode: int, chunks: AsyncIterator[bytes]) -> int:
    """Write `chunks` to `path` atomically (a temp file beside it, then rename), creating parents.

    Returns:
        The file's size in bytes.
    """
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    fd, temp_path = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".part")
    size_bytes = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                await asyncio.to_thread(out.write, chunk)
                size_bytes += len(chunk)
            os.fchmod(out.fileno(), mode)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
    return size_bytes


class SidecarService(pb_grpc.SidecarServicer):
    """The `Sidecar` service of sidecar.proto.

    Args:
        groups: where Exec records the process groups it starts, and Kill finds them.
        snapshots: where Snapshot and Restore keep their snapshots (and Verify its baseline).
    """

    def __init__(self, groups: processes.ProcessGroups, snapshots: SnapshotStore) -> None:
        self.groups = groups
        self.snapshots = snapshots
        self.verifier = Verifier(groups, snapshots)
        self.user = processes.user_name(os.geteuid())

    async def Health(
        self, request: pb.HealthRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.HealthResponse:
        """Report readiness, version, process id and user."""
        return pb.HealthResponse(ready=True, version=__version__, pid=os.getpid(), user=self.user)

    async def _command(
        self, request: pb.ExecRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> processes.Command:
        """Validate an Exec request; abort the RPC with the reason when it cannot run."""
        if not request.argv:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "argv is empty")
        if request.cwd and not os.path.isdir(request.cwd):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"cwd {request.cwd} does not exist or is not a directory"
            )
        if request.timeout_seconds < 0 or not math.isfinite(request.timeout_seconds):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"timeout_seconds must be >= 0, not {request.timeout_seconds}",
            )
        switch_to = None
        if request.service and request.user and request.user != self.user:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a service runs as the sidecar's user {self.user}, not {request.user!r}",
            )
        if request.user and request.user != self.user:
            if os.geteuid() != 0:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"the sidecar runs as {self.user}, not root: it cannot run a command as {request.user}",
                )
            try:
                switch_to = pwd.getpwnam(request.user)
            except KeyError:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown user {request.user!r}")
        return processes.Command(
            argv=list(request.argv),
            cwd=request.cwd or None,
            env=processes.child_env(request.inherit_env, request.env),
            user=request.user or self.user,
            switch_to=switch_to,
            timeout_seconds=request.timeout_seconds,
            stdin=request.stdin,
            service=request.service,
        )

    async def Exec(
        self, request: pb.ExecRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.ExecEvent]:
        """Run a command and stream its output and exit; see `processes.run`."""
        command = await self._command(request, context)
        log.info("exec %s (cwd %s, user %s)", command.argv, command.cwd or ".", command.user)
        async with contextlib.aclosing(processes.run(command, self.groups)) as events:
            async for event in events:
                if event.HasField("exit"):
                    timed_out = " (timed out)" if event.exit.timed_out else ""
                    log.info("exit %d%s: %s", event.exit.exit_code, timed_out, command.argv[0])
                yield event

    async def PutFile(
        self, request_iterator: AsyncIterator[pb.FileChunk], context: grpc.aio.ServicerContext[object, object]
    ) -> pb.PutFileResponse:
        """Receive a file (path and mode on the first chunk) and write it atomically."""
        chunks = aiter(request_iterator)
        first = await anext(chunks, None)
        if first is None or not os.path.isabs(first.path):
            path = first.path if first else ""
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"path must be absolute, not {path!r}")
        mode = first.mode & 0o7777 or DEFAULT_FILE_MODE

        async def data() -> AsyncIterator[bytes]:
            yield first.data
            async for chunk in chunks:
                yield chunk.data

        try:
            size_bytes = await _receive_file(first.path, mode, data())
        except OSError as exc:
            await _abort_os_error(context, first.path, exc)
        log.info("put %s (%d bytes, mode %o)", first.path, size_bytes, mode)
        return pb.PutFileResponse(size_bytes=size_bytes)

    async def GetFile(
        self, request: pb.GetFileRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.FileChunk]:
        """Send a regular file (its first ``max_bytes``, or all of it up to `MAX_GET_FILE_BYTES`) in
        chunks of at most `FILE_CHUNK_BYTES`; see `_open_regular` for what is refused."""
        if not os.path.isabs(request.path):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"path must be absolute, not {request.path!r}"
            )
        try:
            handle, left = _open_regular(request.path, request.max_bytes)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"{request.path}: a symlink; not followed"
                )
            await _abort_os_error(context, request.path, exc)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{request.path}: {exc}")
        with handle:
            while left > 0 and (data := await asyncio.to_thread(handle.read, min(FILE_CHUNK_BYTES, left))):
                left -= len(data)
                yield pb.FileChunk(data=data)

    async def Kill(
        self, request: pb.KillRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.KillResponse:
        """Quiesce the agent's processes, then SIGKILL the Exec process groups of a user (or all);
        see `processes.kill_user`. ABORTED when the quiesce ran out of time."""
        kill = functools.partial(processes.kill_user, self.groups, request.user, request.spare_services)
        try:
            try:
                killed_groups, killed_processes = await asyncio.to_thread(kill)
            except RuntimeError:  # "can't start new thread": the agent used up the sandbox's pids
                killed_groups, killed_processes = kill()  # in the event loop, blocking it meanwhile
        except KeyError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown user {request.user!r}")
        except QuiesceError as exc:
            await context.abort(grpc.StatusCode.ABORTED, str(exc))
        log.info(
            "kill %s: %d groups, %d other processes", request.user or "all", killed_groups, killed_processes
        )
        return pb.KillResponse(killed_groups=killed_groups)

    async def Snapshot(
        self, request: pb.SnapshotRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.SnapshotResponse:
        """Save the requested paths under the snapshot's name."""
        try:
            saved = await self.snapshots.save(request.name, list(request.paths))
        except SidecarRequestError as exc:
            await context.abort(_CODES[exc.kind], str(exc))
        log.info(
            "snapshot %s: %s (%d bytes, %s)",
            request.name,
            list(request.paths),
            saved.size_bytes,
            saved.method,
        )
        return pb.SnapshotResponse(size_bytes=saved.size_bytes, method=saved.method)

    async def Restore(
        self, request: pb.RestoreRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.RestoreResponse:
        """Put a snapshot's paths back exactly."""
        try:
            paths = await self.snapshots.restore(request.name)
        except SidecarRequestError as exc:
            await context.abort(_CODES[exc.kind], str(exc))
        log.info("restore %s: %s", request.name, paths)
        return pb.RestoreResponse(paths=paths)

    async def PrepareVerify(
        self, request: pb.PrepareVerifyRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.PrepareVerifyResponse:
        """Record the verification baseline; see `Verifier.prepare`."""
        try:
            baseline = await self.verifier.prepare(request)
        except SidecarRequestError as exc:
            await context.abort(_CODES[exc.kind], str(exc))
        return pb.PrepareVerifyResponse(
            hooks=baseline.hooks,
            snapshot_paths=baseline.snapshot_paths,
            pytest_plugins=sorted(baseline.plugins.trusted),
        )

    async def Verify(
        self, request: pb.VerifyRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> AsyncIterator[pb.VerifyEvent]:
        """Harden, run the test script and read its reward; see `Verifier.verify`."""
        log.info("verify %s/%s", request.verifier_dir, request.script)
        try:
            async with contextlib.aclosing(self.verifier.verify(request)) as events:
                async for event in events:
                    yield event
        except SidecarRequestError as exc:
            await context.abort(_CODES[exc.kind], str(exc))

    async def Manifest(
        self, request: pb.ManifestRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ManifestResponse:
        """Hash the tree at `request.root` (see `manifest.tree_manifest`)."""
        if not os.path.isabs(request.root):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"root {request.root!r} is not absolute")
        try:
            entries = await asyncio.to_thread(manifest.tree_manifest, request.root)
        except OSError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"cannot hash {request.root}: {exc}")
        return pb.ManifestResponse(entries=entries)


_CODES: dict[SidecarRequestKind, grpc.StatusCode] = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "failed": grpc.StatusCode.INTERNAL,
}
"""The gRPC status of each `SidecarRequestError.kind`."""


def _bound_address(listen: str, port: int) -> str:
    """The address clients connect to: `listen` itself for a unix socket, else host and bound port."""
    if listen.startswith("unix"):
        return listen
    host = listen.rsplit(":", 1)[0]
    return f"{host}:{port}"


def _write_ready_file(path: str, address: str) -> None:
    """Write ``{"address", "pid"}`` to `path` atomically (the shape of `reroll_contracts.proxy.ReadyFile`;
    the sidecar ships without pydantic, the controller validates it)."""
    temp_path = f"{path}.{os.getpid()}.tmp"
    with open(temp_path, "w", encoding="utf-8") as out:
        json.dump({"address": address, "pid": os.getpid()}, out)
    os.replace(temp_path, path)


async def serve(listen: str, token: str, ready_file: str | None, state_dir: str) -> None:
    """Serve until SIGTERM or SIGINT, then kill every Exec process group and stop (1 s grace).

    Args:
        listen: a gRPC address: ``unix:/path/s.sock`` or ``HOST:PORT`` (port 0: any free port).
        token: the bearer token every RPC must carry.
        ready_file: where to write ``{"address", "pid"}`` once listening, or None.
        state_dir: the sidecar's private folder (snapshots live there).

    Raises:
        SystemExit: the address cannot be bound.
    """
    if not quiesce.become_subreaper():  # orphans of Exec's children then stay the sidecar's descendants
        log.warning("cannot become a child subreaper: double-forked processes may escape Kill")
    groups = processes.ProcessGroups()
    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_REQUEST_BYTES)]
    server = grpc.aio.server(interceptors=[BearerTokenInterceptor(token)], options=options)
    pb_grpc.add_SidecarServicer_to_server(SidecarService(groups, SnapshotStore(state_dir)), server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise SystemExit(f"reroll-sidecar: cannot listen on {listen}: {exc}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    address = _bound_address(listen, port)
    if ready_file:
        _write_ready_file(ready_file, address)
    log.info(
        "reroll-sidecar %s listening on %s (pid %d, user %s)",
        __version__,
        address,
        os.getpid(),
        processes.user_name(os.geteuid()),
    )
    await stop.wait()
    log.info("stopping: killed %d process groups", groups.kill())
    await server.stop(STOP_GRACE_SECONDS)
