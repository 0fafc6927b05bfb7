"""What reroll's own backends share: a `Sandbox` whose every operation is an RPC to its sidecar.

A backend subclasses `SidecarSandbox` and supplies only the lifecycle — create the sandbox, start
the sidecar in it, `_connect` to it, tear down — plus `host_address`, `allow_host_port`,
`limits_hit` and `egress`. Exec, files, kill, snapshots and verification are implemented here
once, documented on `Sandbox`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Self, Unpack

from reroll_contracts.errors import SandboxError
from reroll_contracts.hardening import HardeningOptions

from reroll.sandbox.base import SandboxLayout
from reroll.sandbox.results import (
    ExecOptions,
    ExecResult,
    HardeningReport,
    VerifyBaseline,
    VerifyOutcome,
    VerifyScript,
)
from reroll.sandbox.sidecar_bundle import ENTRYPOINT
from reroll.sandbox.sidecar_client import SidecarClient


class SidecarSandbox(abc.ABC):
    """A `Sandbox` driven through the gRPC client of the sidecar running inside it.

    Args:
        layout: the sandbox's paths.
        label: how messages name the sandbox (``local sandbox /tmp/reroll-local-…``).
    """

    sidecar_program: ClassVar[tuple[str, ...]] = tuple(ENTRYPOINT)
    """The sidecar's program as the sandbox's processes run it (its ``probe`` command probes a
    service's URL or port from inside the sandbox: `reroll.environment.services`): the bundle mounted
    at ``/opt/reroll-sidecar``."""

    def __init__(self, layout: SandboxLayout, label: str) -> None:
        self.layout = layout
        self.label = label
        self._client: SidecarClient | None = None

    @property
    def connected(self) -> bool:
        """Whether a sidecar connection is open (between a successful `_connect` and `disconnect`)."""
        return self._client is not None

    @property
    def _sidecar(self) -> SidecarClient:
        """The open sidecar client. Raises SandboxError when not started."""
        if self._client is None:
            raise SandboxError(f"{self.label} is not started")
        return self._client

    async def _connect(self, address: str, token: str) -> SidecarClient:
        """Open (lazily connecting) the client of the sidecar at `address` with its bearer `token`."""
        self._client = await SidecarClient(address, token).__aenter__()
        return self._client

    async def disconnect(self) -> None:
        """Close the sidecar connection and nothing else: the sandbox keeps running, as when its
        controller dies. `stop` still cleans it up. Safe to call twice."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    @abc.abstractmethod
    async def host_address(self) -> str:
        """See `Sandbox.host_address`."""

    @abc.abstractmethod
    async def allow_host_port(self, port: int) -> None:
        """See `Sandbox.allow_host_port`."""

    @abc.abstractmethod
    async def limits_hit(self) -> list[str]:
        """See `Sandbox.limits_hit`."""

    @abc.abstractmethod
    def egress(self) -> contextlib.AbstractAsyncContextManager[dict[str, str]]:
        """See `Sandbox.egress`."""

    @abc.abstractmethod
    async def start(self) -> None:
        """See `Sandbox.start`."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """See `Sandbox.stop`."""

    async def __aenter__(self) -> Self:
        """See `Sandbox.__aenter__`."""
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """See `Sandbox.__aexit__`."""
        await self.stop()

    async def exec(
        self,
        argv: list[str],
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        **options: Unpack[ExecOptions],
    ) -> ExecResult:
        """See `Sandbox.exec`."""
        return await self._sidecar.exec(argv, on_output=on_output, **options)

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        """See `Sandbox.put_file`."""
        return await self._sidecar.put_file(path, data, mode)

    async def get_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """See `Sandbox.get_file`."""
        return await self._sidecar.get_file(path, max_bytes)

    async def upload_dir(self, source: Path, destination: str) -> int:
        """See `Sandbox.upload_dir`."""
        count = 0
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            target = f"{destination.rstrip('/')}/{file.relative_to(source).as_posix()}"
            await self.put_file(target, file.read_bytes(), mode=file.stat().st_mode & 0o777)
            count += 1
        return count

    async def manifest(self, root: str) -> dict[str, str]:
        """See `Sandbox.manifest`."""
        return await self._sidecar.manifest(root)

    async def kill(self, user: str = "", *, spare_services: bool = False) -> int:
        """See `Sandbox.kill`."""
        return await self._sidecar.kill(user, spare_services=spare_services)

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """See `Sandbox.snapshot`."""
        return await self._sidecar.snapshot(name, paths or [self.layout.workspace])

    async def restore(self, name: str) -> list[str]:
        """See `Sandbox.restore`."""
        return await self._sidecar.restore(name)

    async def prepare_verify(
        self, hardening: HardeningOptions, env: Mapping[str, str], pytest_plugins: Sequence[str] = ()
    ) -> VerifyBaseline:
        """See `Sandbox.prepare_verify`."""
        return await self._sidecar.prepare_verify(
            workspace=self.layout.workspace,
            home=self.layout.home,
            agent_user=self.layout.agent_user,
            hardening=hardening,
            env=env,
            pytest_plugins=pytest_plugins,
        )

    async def verify(
        self,
        run: VerifyScript,
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        on_hardening: Callable[[HardeningReport], None] | None = None,
    ) -> VerifyOutcome:
        """See `Sandbox.verify`: in the workspace, under the image's own ENV."""
        return await self._sidecar.verify(
            run,
            cwd=self.layout.workspace,
            image_env=self.layout.image_env,
            on_output=on_output,
            on_hardening=on_hardening,
        )
