"""Child processes of the controller: the sidecar (local backend), the LLM proxy, the scripted model.

Each is a Python module run as ``python -m MODULE ... --ready-file F``; it writes a
`reroll_contracts.proxy.ReadyFile` (``{"pid", "address"}``) to F once it listens (the
interceptor, mitmdump with its addon, too). `ChildProcess` starts one, waits for that file,
reads it typed, and stops the process explicitly (SIGTERM, then SIGKILL after a grace period) —
never from a finaliser. On Linux a child also dies with the controller (``PR_SET_PDEATHSIG``),
even when the controller is SIGKILLed.

The death signal is set by util-linux ``setpriv --pdeathsig KILL``, which then execs the child,
not by a ``preexec_fn``: a ``preexec_fn`` runs Python (and every ``os.register_at_fork``
handler, e.g. filelock's, which ray imports) in the forked child of a multi-threaded
controller, and such children crashed at start (SIGSEGV, SIGABRT) when many rollouts started at
once. Without ``setpriv`` the ``preexec_fn`` is the fallback. On uvloop every child is forked
(not vforked) whatever its options, and the fork hooks, C (``pthread_atfork``) and Python
(``os.register_at_fork``), run in it before its exec: gRPC's, which crashed such children, are
kept off (`reroll.host.forking`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from reroll_contracts.errors import InfrastructureError

if TYPE_CHECKING:
    from reroll_contracts.proxy import ReadyFile  # imported where read: `reroll.cli.early` spawns
    # the shared proxy before it loads pydantic and the contracts' models (0.1 CPU-s)

READY_POLL_SECONDS = 0.005
"""How often `ChildProcess.start` looks for the ready file (a ``stat``): the wait it adds to a start."""


class ChildProcess:
    """A Python module running as a child process that announces readiness through a file.

    Args:
        module: the module to run with ``python -m``.
        args: its command-line arguments, without ``--ready-file`` (added here).
        workdir: a folder for the ready file and the process's log (``<name>.log``).
        name: a short name used in file names and error messages.
        env: the child's environment (default: the controller's).
        command: the program and its arguments before `args` (default: ``[python, "-m", module]``
            with the controller's interpreter), e.g. another virtualenv's interpreter and a script.
        pass_fds: file descriptors the child inherits (besides its standard streams).
    """

    def __init__(
        self,
        module: str,
        args: list[str],
        *,
        workdir: Path,
        name: str,
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.module = module
        self.command = command or [sys.executable, "-m", module]
        self.args = args
        self.name = name
        self.env = env
        self.pass_fds = pass_fds
        self.ready_file = workdir / f"{name}.ready.json"
        self.log_path = workdir / f"{name}.log"
        self._ready: ReadyFile | None = None
        self._process: asyncio.subprocess.Process | None = None

    @property
    def ready(self) -> ReadyFile:
        """What the child announced in its ready file; `start` first."""
        assert self._ready is not None, f"{self.name}: start() first"
        return self._ready

    @property
    def pid(self) -> int | None:
        """The child's process id, once started."""
        return self._process.pid if self._process else None

    async def start(self, ready_timeout_seconds: float = 30.0) -> ReadyFile:
        """Start the child and wait until it wrote its ready file.

        Returns:
            The ready file (e.g. ``{"pid": 42, "address": "http://127.0.0.1:8123/v1"}``).

        Raises:
            InfrastructureError: the child exited first, was not ready within the timeout (the
                message carries the end of its log), or wrote an invalid ready file (named).
        """
        self.ready_file.unlink(missing_ok=True)
        argv = [*self.command, *self.args, "--ready-file", str(self.ready_file)]
        preexec = None
        if sys.platform == "linux":
            setpriv = shutil.which("setpriv")
            if setpriv is not None:
                argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
            else:
                preexec = _die_with_parent
        with open(self.log_path, "ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                preexec_fn=preexec,
                pass_fds=self.pass_fds,
            )
        try:
            return await self._ready_within(ready_timeout_seconds)
        except asyncio.CancelledError:  # e.g. its command ended first: the child must not outlive it
            await self.stop()
            raise

    async def _ready_within(self, ready_timeout_seconds: float) -> ReadyFile:
        """Wait for the started child's ready file (`start`)."""
        assert self._process is not None
        deadline = time.monotonic() + ready_timeout_seconds
        while not self.ready_file.exists():
            if self._process.returncode is not None:
                raise InfrastructureError(
                    f"{self.name} exited with {exit_description(self._process.returncode)} before it "
                    f"was ready:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                await self.stop()
                raise InfrastructureError(
                    f"{self.name} was not ready after {ready_timeout_seconds:.0f} s:\n{self.log_tail()}"
                )
            await asyncio.sleep(READY_POLL_SECONDS)
        from pydantic import ValidationError  # see the module's imports
        from reroll_contracts.proxy import ReadyFile

        try:
            self._ready = ReadyFile.model_validate_json(self.ready_file.read_bytes())
        except ValidationError as exc:
            await self.stop()
            raise InfrastructureError(f"{self.name}: invalid ready file {self.ready_file}:\n{exc}") from exc
        return self._ready

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self._process is not None and self._process.returncode is None

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """SIGTERM the child, then SIGKILL it if it has not exited after `grace_seconds`."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last `max_bytes` bytes of the child's log, decoded."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, os.path.getsize(self.log_path) - max_bytes))
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"

    async def __aenter__(self) -> ChildProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


_PR_SET_PDEATHSIG = 1


def exit_description(returncode: int) -> str:
    """How a child ended, from its return code: ``code 3``, or ``signal SIGSEGV (11)`` for a
    negative code (asyncio's and `subprocess`'s way of saying a signal killed it)."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "an unknown signal"
    return f"signal {name} ({-returncode})"


def _die_with_parent() -> None:
    """Run in the child before exec where ``setpriv`` is missing: the kernel SIGKILLs it when the
    controller dies (Linux), so a killed controller leaves no proxy, model server or sidecar behind."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
