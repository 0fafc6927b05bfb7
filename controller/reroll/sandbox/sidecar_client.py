"""The host side of the sidecar contract: an async client for the sidecar daemon of a sandbox.

`SidecarSandbox` (what reroll's backends share) drives its sidecar through one `SidecarClient`;
nothing outside ``reroll.sandbox`` uses it — callers use the `Sandbox` protocol. gRPC errors are
converted at this boundary into `reroll_contracts.errors.SidecarError` (an RPC failed; the message names the
RPC, the status and the details) and its subclass `reroll_contracts.errors.SidecarUnavailable` (no
connection, or the sidecar was not ready in time).

`get_file` raises the built-in FileNotFoundError for a missing file, `verify` for a missing test script.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NoReturn, Unpack

import grpc
from reroll_contracts.errors import QuiesceError, SidecarError, SidecarUnavailable, VerifierError
from reroll_contracts.hardening import HardeningOptions
from reroll_protos.sidecar.v1 import sidecar_pb2 as pb
from reroll_protos.sidecar.v1 import sidecar_pb2_grpc as pb_grpc

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


class SidecarClient:
    """An async client of one sidecar. Open it with ``async with`` (or `__aenter__`), close with `close`.

    Args:
        address: the gRPC target, ``unix:/path/s.sock`` or ``HOST:PORT``.
        token: the sidecar's bearer token; empty sends no authorization (the sidecar then refuses).
    """

    def __init__(self, address: str, token: str) -> None:
        self.address = address
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SidecarAsyncStub | None = None

    async def __aenter__(self) -> SidecarClient:
        """Open the channel (connecting lazily, on the first RPC)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS)
            self._stub = pb_grpc.SidecarStub(self._channel)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; RPCs still running are cancelled. Safe to call twice."""
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()

    @property
    def _rpc(self) -> pb_grpc.SidecarAsyncStub:
        """The gRPC stub. Raises SidecarError when the client is not open."""
        if self._stub is None:
            raise SidecarError(f"sidecar client for {self.address} is not open")
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
            **options: as `Sandbox.exec` takes them (`ExecOptions`); an empty `cwd` is the
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
        timeout_seconds = request.timeout_seconds
        deadline = timeout_seconds + EXEC_DEADLINE_MARGIN_SECONDS if timeout_seconds > 0 else None
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
        """Run `argv` in the sandbox to its end and collect its output.

        Takes the arguments of `exec_stream`, plus:

        Args:
            on_output: called with ``("stdout" | "stderr", chunk)`` for every chunk as it arrives.

        Returns:
            The exit code, the whole stdout and stderr (with `on_output`: the last
            `STREAMED_TAIL_BYTES` of each), whether it timed out, and how long it took.

        Raises:
            SidecarError: the RPC failed (see `exec_stream`).
            SidecarUnavailable: the sidecar cannot be reached.
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
            max_bytes: stop after this many bytes (the stream is cancelled); None: read it all.

        Returns:
            The file's content (its first `max_bytes` bytes).

        Raises:
            FileNotFoundError: the file does not exist (the message names `path`).
            SidecarError: any other failure (PERMISSION_DENIED; FAILED_PRECONDITION: a symlink, never
                followed; not a regular file, a FIFO never waited on; larger than the sidecar's
                cap of 1 GiB without `max_bytes`).
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

    async def manifest(self, root: str) -> dict[str, str]:
        """Hash the tree at the absolute `root` in the sidecar (``reroll_sidecar.manifest``).

        Returns:
            ``{relative path: sha256 hex, or "symlink:<target>", "fifo:", "socket:", "device:",
            "unreadable:<why>"}``, sorted by path.

        Raises:
            VerifierError: the hashing took longer than `MANIFEST_DEADLINE_SECONDS`.
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
        """Quiesce (freeze, then kill) the agent's processes, then SIGKILL the process groups
        started through exec for `user` (empty: for every user).

        The agent's processes are every descendant of the sidecar outside its session (empty
        `user`) or, when the sidecar is root and `user` is another, non-root user, every process
        of that user (``reroll_sidecar.quiesce``); with `spare_services` both, but the task's
        services (exec with ``service``) and what they forked.

        Returns:
            How many process groups were signalled.

        Raises:
            QuiesceError: the processes were not all gone within the sidecar's time limit.
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

    async def snapshot(self, name: str, paths: list[str]) -> int:
        """Save the absolute `paths` in the sandbox as snapshot `name` (replacing one of that name).

        Returns:
            The stored snapshot's size in bytes.

        Raises:
            SidecarError: the RPC failed (INVALID_ARGUMENT for a bad name or path, INTERNAL when tar failed).
        """
        try:
            response = await self._rpc.Snapshot(
                pb.SnapshotRequest(name=name, paths=paths),
                timeout=SNAPSHOT_DEADLINE_SECONDS,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            _raise(exc, f"{self.address} Snapshot {name}")
        return response.size_bytes

    async def restore(self, name: str) -> list[str]:
        """Restore snapshot `name` exactly (contents, modes, symlinks; later files deleted).

        Returns:
            The paths restored.

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
        self,
        *,
        workspace: str,
        home: str,
        agent_user: str,
        hardening: HardeningOptions,
        env: Mapping[str, str],
        pytest_plugins: Sequence[str] = (),
    ) -> VerifyBaseline:
        """Record the verification baseline before the agent runs (replacing an earlier one).

        Args:
            workspace: the agent's workspace; its build-config files are snapshotted.
            home: the agent's HOME, scanned for start-up hooks.
            agent_user: the agent's user; empty = the sidecar's own (local: no /tmp, no site dirs).
            hardening: the task's hardening options, which the later `verify` applies.
            env: the environment in which the sandbox's ``python3`` is found (PATH).
            pytest_plugins: the plugins the task declares, which the test script's pytest loads.

        Raises:
            SidecarError: the RPC failed (INTERNAL when a scan or the snapshot failed).
        """
        request = pb.PrepareVerifyRequest(
            workspace=workspace,
            home=home,
            agent_user=agent_user,
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
        cwd: str = "",
        image_env: Mapping[str, str] | None = None,
        on_output: Callable[[str, bytes], None] | None = None,
        on_hardening: Callable[[HardeningReport], None] | None = None,
    ) -> VerifyOutcome:
        """Harden the sandbox, run the test script and read its reward (see sidecar.proto, Verify).

        Args:
            run: the script and its policy (see `Sandbox.verify`).
            cwd: the script's working folder (the image's WORKDIR); empty = ``run.verifier_dir``.
            image_env: the image's own ENV, under ``run.env`` and not cleaned (an image's
                PYTHONPATH stays).
            on_output: called with ``("stdout" | "stderr", chunk)`` for every chunk as it arrives;
                the outcome then keeps the last `STREAMED_TAIL_BYTES` of each stream.
            on_hardening: called with the hardening report once it arrives, before the script runs.

        Raises:
            FileNotFoundError: the test script is missing (the message names it).
            SidecarError: the RPC failed, e.g. FAILED_PRECONDITION without `prepare_verify` before.
            SidecarUnavailable: the sidecar cannot be reached or died.
        """
        request = verify_request(run, cwd, image_env or {})
        timeout_seconds = run.timeout_seconds
        deadline = timeout_seconds + VERIFY_DEADLINE_MARGIN_SECONDS if timeout_seconds > 0 else None
        call = self._rpc.Verify(request, timeout=deadline, metadata=self._metadata)
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
