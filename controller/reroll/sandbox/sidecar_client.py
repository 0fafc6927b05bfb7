"""The operations of a sandbox, written once: `SidecarClient`, each an RPC to the sidecar daemon
running inside the sandbox.

`reroll.sandbox.base.Sandbox` (what every backend subclasses) inherits them and adds only the
lifecycle, which differs by backend. gRPC errors are converted at this boundary into
`reroll_contracts.errors.SidecarError` (an RPC failed; the message names the RPC, the status and
the details) and its subclass `reroll_contracts.errors.SidecarUnavailable` (no connection, or the
sidecar was not ready in time); both are SandboxErrors. Every operation raises SandboxError
("... is not started") before `SidecarClient.connect` or after `SidecarClient.disconnect`.
`get_file` raises the built-in FileNotFoundError for a missing file, `verify` for a missing test script.

Limits: exec output arrives in chunks of at most 64 KiB and is also kept in memory for the
result: whole, or only the last `reroll.sandbox.results.STREAMED_TAIL_BYTES` of each stream when
the caller takes every chunk through ``on_output`` (the agent's run: its output goes to the run
folder); files move in 1 MiB chunks, held whole in memory, each transfer within 120 s; a
snapshot or restore within 660 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn, Unpack

import grpc
from reroll_contracts.errors import (
    QuiesceError,
    SandboxError,
    SidecarError,
    SidecarUnavailable,
    VerifierError,
)
from reroll_contracts.hardening import HardeningOptions
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_protos.sidecar.v1 import sidecar_pb2_grpc as pb_grpc

from reroll.sandbox.layout import SandboxLayout
from reroll.sandbox.results import (
    STREAMED_TAIL_BYTES,
    ExecOptions,
    ExecResult,
    HardeningReport,
    OutputTail,
    VerifyBaseline,
    VerifyOutcome,
    VerifyScript,
)
from reroll.sandbox.sidecar_wire import exec_request, hardening_report, verify_outcome, verify_request

HEALTH_DEADLINE_SECONDS = 5.0
FILE_DEADLINE_SECONDS = 120.0
KILL_DEADLINE_SECONDS = 30.0
SNAPSHOT_DEADLINE_SECONDS = 660.0
MANIFEST_DEADLINE_SECONDS = 300.0
"""The longest the workspace manifest may take; the agent controls the tree, so running out is
a verifier error, never an infrastructure one."""
EXEC_DEADLINE_MARGIN_SECONDS = 30.0
"""Added to an Exec's own timeout for its RPC deadline, so the sidecar reports the timeout first."""
VERIFY_DEADLINE_MARGIN_SECONDS = SNAPSHOT_DEADLINE_SECONDS
"""Added to the test script's timeout for Verify's RPC deadline: hardening restores a snapshot."""
FILE_CHUNK_BYTES = 1024 * 1024
"""The size of the chunks `put_file` sends."""

_CHANNEL_OPTIONS = [
    # The sidecar is near; retry a refused connection quickly instead of gRPC's default 1 s → 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A manifest of a large workspace (25,600 files: about 2.5 MB) may pass gRPC's 4 MiB default.
    ("grpc.max_receive_message_length", 64 << 20),
]


@dataclass(frozen=True)
class SidecarHealth:
    """What the sidecar's Health RPC reports."""

    ready: bool
    version: str
    pid: int
    """The sidecar's process id (inside the sandbox)."""
    user: str
    """The user the sidecar runs as."""


@dataclass(frozen=True)
class ExecExit:
    """The last item `SidecarClient.exec_stream` yields."""

    exit_code: int
    """The exit code, or the negative signal number when killed by a signal (-9 after a timeout)."""
    timed_out: bool
    """Whether the process group was killed because the timeout elapsed."""


ExecItem = tuple[Literal["stdout", "stderr"], bytes] | ExecExit
"""One item of `SidecarClient.exec_stream`: an output chunk, or the exit at the end."""


def _raise(exc: grpc.aio.AioRpcError, what: str) -> NoReturn:
    """Convert a gRPC error of the RPC described by `what` into a SidecarError."""
    code = exc.code()
    cls = SidecarUnavailable if code == grpc.StatusCode.UNAVAILABLE else SidecarError
    raise cls(f"sidecar {what} failed: {code.name}: {exc.details()}") from exc


def _deadline(timeout_seconds: float, margin_seconds: float) -> float | None:
    """The RPC deadline of a command with `timeout_seconds` (0: none): its timeout plus
    `margin_seconds`, so the sidecar reports the timeout first; None without a timeout."""
    return timeout_seconds + margin_seconds if timeout_seconds > 0 else None


class SidecarClient:
    """A sandbox's operations over the gRPC client of its sidecar. `connect` opens the
    connection (a backend's `start` does), `disconnect` closes it.

    Args:
        layout: the sandbox's paths (a backend may settle parts of it when it starts).
        label: how messages name the sandbox (``local sandbox /tmp/reroll-local-…``).
    """

    def __init__(self, layout: SandboxLayout, label: str) -> None:
        self.layout = layout
        """Paths inside the sandbox, and the environment variables that name them (`SandboxLayout.env`)."""
        self.label = label
        self.address = ""
        """The sidecar's gRPC target, ``unix:/path/s.sock`` or ``HOST:PORT`` (empty until `connect`)."""
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SidecarAsyncStub | None = None

    @property
    def connected(self) -> bool:
        """Whether a sidecar connection is open (between `connect` and `disconnect`)."""
        return self._stub is not None

    async def connect(self, address: str, token: str) -> None:
        """Open the channel to the sidecar at `address` (connecting lazily, on the first RPC),
        closing one open before.

        Args:
            address: the gRPC target, ``unix:/path/s.sock`` or ``HOST:PORT``.
            token: the sidecar's bearer token; empty sends no authorization (the sidecar then refuses).
        """
        await self.disconnect()
        self.address = address
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.SidecarStub(self._channel)

    async def disconnect(self) -> None:
        """Close the sidecar connection and nothing else (RPCs still running are cancelled): the
        sandbox keeps running, as when its controller dies; a backend's ``stop`` still cleans it
        up. Safe to call twice."""
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()

    @property
    def _rpc(self) -> pb_grpc.SidecarAsyncStub:
        """The gRPC stub. Raises SandboxError when not connected."""
        if self._stub is None:
            raise SandboxError(f"{self.label} is not started")
        return self._stub

    async def health(self) -> SidecarHealth:
        """Ask the sidecar whether it is ready (deadline `HEALTH_DEADLINE_SECONDS`).

        Raises:
            SidecarUnavailable: the sidecar cannot be reached, or did not answer within the deadline.
            SidecarError: any other failure (e.g. UNAUTHENTICATED).
        """
        return await self._health(HEALTH_DEADLINE_SECONDS)

    async def _health(self, deadline_seconds: float) -> SidecarHealth:
        """Health with a deadline of `deadline_seconds`."""
        try:
            response = await self._rpc.Health(
                pb.HealthRequest(), timeout=deadline_seconds, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise SidecarUnavailable(
                    f"sidecar {self.address} Health: no answer within {deadline_seconds:.1f} s"
                ) from exc
            _raise(exc, f"{self.address} Health")
        return SidecarHealth(
            ready=response.ready, version=response.version, pid=response.pid, user=response.user
        )

    async def wait_ready(self, timeout_seconds: float = 30.0) -> None:
        """Poll Health until the sidecar reports ready.

        Raises:
            SidecarUnavailable: not ready within `timeout_seconds`; names the address and the last error.
            SidecarError: the sidecar answered with a permanent error (such as UNAUTHENTICATED).
        """
        deadline = time.monotonic() + timeout_seconds
        last_error = "it never answered"
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                health = await self._health(min(remaining, HEALTH_DEADLINE_SECONDS))
            except SidecarUnavailable as exc:
                last_error = str(exc)
            else:
                if health.ready:
                    return
                last_error = "it answered ready=false"
            await asyncio.sleep(0.05)
        raise SidecarUnavailable(
            f"sidecar at {self.address} not ready after {timeout_seconds:.1f} s; last error: {last_error}"
        )

    async def exec_stream(
        self, argv: list[str], **options: Unpack[ExecOptions]
    ) -> AsyncGenerator[ExecItem, None]:
        """Run `argv` in the sandbox and yield its output as produced, then its exit.

        Closing the generator early (use ``contextlib.aclosing``) or cancelling the task that
        iterates it cancels the RPC, and the sidecar then kills the process group.

        Args:
            argv: the program and its arguments (looked up in the child's PATH).
            **options: how to run it (`ExecOptions`); an empty `cwd` is the
                sidecar's, an empty `user` the sidecar's own (it must be root for another);
                a `service` is spared by the agent's quiesce (``ExecRequest.service``).

        Yields:
            ``("stdout", chunk)`` / ``("stderr", chunk)`` (≤ 64 KiB each), then one `ExecExit`.
            A program that does not exist ends with exit code 127 and the error on stderr.

        Raises:
            SidecarError: the RPC failed, e.g. INVALID_ARGUMENT for a nonexistent `cwd`.
            SidecarUnavailable: the sidecar cannot be reached.
        """
        request = exec_request(argv, options)
        deadline = _deadline(request.timeout_seconds, EXEC_DEADLINE_MARGIN_SECONDS)
        call = self._rpc.Exec(request, timeout=deadline, metadata=self._metadata)
        exit_status: ExecExit | None = None
        try:
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "stdout":
                    yield ("stdout", event.stdout)
                elif kind == "stderr":
                    yield ("stderr", event.stderr)
                elif kind == "exit":
                    exit_status = ExecExit(exit_code=event.exit.exit_code, timed_out=event.exit.timed_out)
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} Exec {argv[:3]}")
        finally:
            call.cancel()  # a no-op after the end; stops the command when the consumer left early
        if exit_status is None:
            raise SidecarError(f"sidecar {self.address} Exec {argv[:3]}: the stream ended without an exit")
        yield exit_status

    async def exec(
        self,
        argv: list[str],
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        **options: Unpack[ExecOptions],
    ) -> ExecResult:
        """Run `argv` in the sandbox, in a process group of its own, to its end.

        Cancelling the awaiting task kills the process group.

        Args:
            argv: the program and its arguments (looked up in the child's PATH).
            on_output: called with ``("stdout" | "stderr", chunk)`` for every chunk as it arrives;
                the result then holds only the last `STREAMED_TAIL_BYTES` of each stream.
            **options: working folder, environment, user, timeout, stdin, service (`ExecOptions`;
                their defaults as `exec_stream` says).

        Returns:
            The exit code (127 for a program that does not exist, with the error on stderr; the
            negative signal number when killed, -9 after a timeout), the stdout and stderr
            (whole without `on_output`), whether it timed out, and its duration in seconds.

        Raises:
            SidecarError: the command could not be started (e.g. INVALID_ARGUMENT for a
                nonexistent `cwd` or `user`), or the RPC failed.
            SidecarUnavailable: the sidecar cannot be reached (the sandbox died).
        """
        started = time.monotonic()
        kept = STREAMED_TAIL_BYTES if on_output is not None else None
        output = {"stdout": OutputTail(kept), "stderr": OutputTail(kept)}
        exit_status: ExecExit | None = None
        stream = self.exec_stream(argv, **options)
        async with contextlib.aclosing(stream) as items:
            async for item in items:
                if isinstance(item, ExecExit):
                    exit_status = item
                    continue
                name, chunk = item
                output[name].add(chunk)
                if on_output is not None:
                    on_output(name, chunk)
        assert exit_status is not None, "exec_stream ends with an ExecExit or raises"
        return ExecResult(
            exit_code=exit_status.exit_code,
            stdout=output["stdout"].value(),
            stderr=output["stderr"].value(),
            timed_out=exit_status.timed_out,
            duration_seconds=time.monotonic() - started,
        )

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        """Write `data` to the absolute `path` in the sandbox, atomically, creating parent folders.

        Args:
            path: absolute path in the sandbox.
            data: the file's whole content.
            mode: permission bits, e.g. ``0o755``.

        Returns:
            The size written, in bytes.

        Raises:
            SidecarError: the RPC failed (e.g. INVALID_ARGUMENT for a relative path, PERMISSION_DENIED).
        """

        def chunks() -> Iterator[pb.FileChunk]:
            yield pb.FileChunk(path=path, mode=mode, data=data[:FILE_CHUNK_BYTES])
            for start in range(FILE_CHUNK_BYTES, len(data), FILE_CHUNK_BYTES):
                yield pb.FileChunk(data=data[start : start + FILE_CHUNK_BYTES])

        try:
            response = await self._rpc.PutFile(
                chunks(), timeout=FILE_DEADLINE_SECONDS, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} PutFile {path}")
        return response.size_bytes

    async def get_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read the file at the absolute `path` in the sandbox.

        Args:
            path: absolute path in the sandbox.
            max_bytes: read at most this many bytes (the start of the file; the stream is then
                cancelled); None: all of it.

        Returns:
            The file's whole content (its first `max_bytes` bytes).

        Raises:
            FileNotFoundError: the file does not exist (the message names `path`).
            SidecarError: any other failure (PERMISSION_DENIED; FAILED_PRECONDITION: a symlink, never
                followed; not a regular file: a folder, a FIFO, never waited on; larger than the
                sidecar's cap of 1 GiB without `max_bytes`).
        """
        parts: list[bytes] = []
        size = 0
        call = self._rpc.GetFile(
            pb.GetFileRequest(path=path, max_bytes=max_bytes or 0),
            timeout=FILE_DEADLINE_SECONDS,
            metadata=self._metadata,
        )
        try:
            async for chunk in call:
                parts.append(chunk.data)
                size += len(chunk.data)
                if max_bytes is not None and size >= max_bytes:
                    call.cancel()
                    break
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(f"no such file in the sandbox: {path}") from exc
            _raise(exc, f"{self.address} GetFile {path}")
        content = b"".join(parts)
        return content if max_bytes is None else content[:max_bytes]

    async def upload_dir(self, source: Path, destination: str) -> int:
        """Copy every file under host folder `source` to `destination` in the sandbox, keeping modes.

        Returns:
            The number of files copied.

        Raises:
            SidecarError: as `put_file`.
        """
        count = 0
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            target = f"{destination.rstrip('/')}/{file.relative_to(source).as_posix()}"
            await self.put_file(target, file.read_bytes(), mode=file.stat().st_mode & 0o777)
            count += 1
        return count

    async def manifest(self, root: str) -> dict[str, str]:
        """Hash every regular file under the absolute folder `root` (the workspace manifest) in
        the sidecar (``reroll_sidecar.manifest``: no tool of the image), following no symlink
        and opening nothing but regular files.

        Returns:
            ``{relative path: sha256 hex}``, sorted by path; a symlink (to a file or a folder) as
            ``"symlink:<target>"``, a FIFO, socket or device as ``"fifo:"``, ``"socket:"``,
            ``"device:"`` (never opened), a file that cannot be read as ``"unreadable:<why>"``;
            bytecode caches (``__pycache__/``, ``*.pyc``) are left out.

        Raises:
            VerifierError: the hashing took longer than `MANIFEST_DEADLINE_SECONDS` (the agent
                controls the tree).
            SidecarError: `root` is not an absolute folder, or the RPC failed.
        """
        try:
            response = await self._rpc.Manifest(
                pb.ManifestRequest(root=root), timeout=MANIFEST_DEADLINE_SECONDS, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise VerifierError(
                    f"hashing the workspace {root} took longer than {MANIFEST_DEADLINE_SECONDS:.0f} s"
                ) from exc
            _raise(exc, f"{self.address} Manifest {root}")
        return dict(sorted(response.entries.items()))

    async def kill(self, user: str = "", *, spare_services: bool = False) -> int:
        """Quiesce the agent's processes, then SIGKILL the process groups started through `exec`
        for `user` (empty: for every user).

        Quiesce freezes, then kills, every process the agent left, whatever it does to escape
        (fork storms, ``setsid``, double forks; ``reroll_sidecar.quiesce``): with an empty
        `user` every process `exec` started and all their descendants (every descendant of the
        sidecar outside its session); where the sidecar runs as root and `user` is another,
        non-root user, every process of that user. None is left when this returns.
        `spare_services` (the agent's quiesce): every process `exec` started and all their
        descendants, and every process of `user`, but the task's services (``exec`` with
        ``service``) and what they forked, which live on.

        Returns:
            How many process groups were signalled.

        Raises:
            QuiesceError: processes were still alive after the sidecar's time limit.
            SidecarError: the RPC failed.
        """
        try:
            response = await self._rpc.Kill(
                pb.KillRequest(user=user, spare_services=spare_services),
                timeout=KILL_DEADLINE_SECONDS,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED:
                raise QuiesceError(f"sidecar {self.address} Kill {user or 'all'}: {exc.details()}") from exc
            _raise(exc, f"{self.address} Kill")
        return response.killed_groups

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """Save `paths` (absolute, in the sandbox; default: the workspace) as snapshot `name`,
        replacing one of that name.

        Returns:
            The snapshot's size in bytes.

        Raises:
            SidecarError: the RPC failed (INVALID_ARGUMENT for a bad name or path, INTERNAL when
                the snapshot could not be stored).
        """
        try:
            response = await self._rpc.Snapshot(
                pb.SnapshotRequest(name=name, paths=paths or [self.layout.workspace]),
                timeout=SNAPSHOT_DEADLINE_SECONDS,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} Snapshot {name}")
        return response.size_bytes

    async def restore(self, name: str) -> list[str]:
        """Restore snapshot `name` exactly: contents, modes, owners, symlinks, hard links, and
        deletions of what came since.

        Returns:
            The paths restored (those given to `snapshot`).

        Raises:
            SidecarError: the RPC failed (NOT_FOUND for an unknown name).
        """
        try:
            response = await self._rpc.Restore(
                pb.RestoreRequest(name=name), timeout=SNAPSHOT_DEADLINE_SECONDS, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} Restore {name}")
        return list(response.paths)

    async def prepare_verify(
        self, hardening: HardeningOptions, env: Mapping[str, str], pytest_plugins: Sequence[str] = ()
    ) -> VerifyBaseline:
        """Record the verification baseline before the agent runs (replacing an earlier one):
        the start-up hooks in the layout's workspace and HOME, a snapshot of the workspace's
        build-config files, and the trusted pytest plugins of the sandbox's ``python3`` (none
        of ``/tmp`` and the site folders where the layout has no agent user of its own).

        Args:
            hardening: the task's hardening options, which the later `verify` applies.
            env: the environment in which the sandbox's ``python3`` is found (PATH).
            pytest_plugins: the plugins the task declares, which the test script's pytest loads.

        Raises:
            SidecarError: the RPC failed (INTERNAL when a scan or the snapshot failed).
        """
        request = pb.PrepareVerifyRequest(
            workspace=self.layout.workspace,
            home=self.layout.home,
            agent_user=self.layout.agent_user,
            hardening=pb.Hardening(**hardening.model_dump(), pytest_plugins=pytest_plugins),
            env=dict(env),
        )
        try:
            response = await self._rpc.PrepareVerify(
                request, timeout=SNAPSHOT_DEADLINE_SECONDS, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} PrepareVerify")
        return VerifyBaseline(
            hooks=list(response.hooks),
            snapshot_paths=list(response.snapshot_paths),
            pytest_plugins=list(response.pytest_plugins),
        )

    async def verify(
        self,
        run: VerifyScript,
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        on_hardening: Callable[[HardeningReport], None] | None = None,
    ) -> VerifyOutcome:
        """Harden the sandbox as `prepare_verify` recorded and `run` asks, run the test script as
        root in a clean environment, and read its reward (see sidecar.proto, Verify).

        Args:
            run: the script, its folders, environment, timeout and options (`VerifyScript`).
            on_output: called with ``("stdout" | "stderr", chunk)`` for every chunk as it arrives;
                the outcome then keeps the last `STREAMED_TAIL_BYTES` of each stream.
            on_hardening: called with the hardening report once it is done, before the script runs.

        Returns:
            The hardening report, the script's exit, output and reward (or why there is none).

        Raises:
            FileNotFoundError: the test script is missing (the message names it).
            SidecarError: the RPC failed, e.g. FAILED_PRECONDITION without `prepare_verify` before.
            SidecarUnavailable: the sidecar cannot be reached or died.
        """
        deadline = _deadline(run.timeout_seconds, VERIFY_DEADLINE_MARGIN_SECONDS)
        call = self._rpc.Verify(verify_request(run), timeout=deadline, metadata=self._metadata)
        kept = STREAMED_TAIL_BYTES if on_output is not None else None
        output = {"stdout": OutputTail(kept), "stderr": OutputTail(kept)}
        report = HardeningReport(killed_groups=0, restored=[], deleted=[])
        result: pb.VerifyResult | None = None
        try:
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "hardening":
                    report = hardening_report(event.hardening)
                    if on_hardening is not None:
                        on_hardening(report)
                elif kind in ("stdout", "stderr"):
                    chunk: bytes = getattr(event, kind)
                    output[kind].add(chunk)
                    if on_output is not None:
                        on_output(kind, chunk)
                elif kind == "result":
                    result = event.result
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise FileNotFoundError(exc.details()) from exc
            _raise(exc, f"{self.address} Verify {run.verifier_dir}/{run.script}")
        finally:
            call.cancel()  # a no-op after the end; stops the script when the caller was cancelled
        if result is None:
            raise SidecarError(f"sidecar {self.address} Verify: the stream ended without a result")
        return verify_outcome(result, report, output)
