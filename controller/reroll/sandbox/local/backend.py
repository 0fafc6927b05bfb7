"""The `local` backend (``--sandbox local``, the default): an isolated sandbox
(`reroll.sandbox.local.isolated`), or the plain one where this machine forbids namespaces."""

from __future__ import annotations

from typing import ClassVar

from reroll_contracts.errors import SandboxError

from reroll.host.notices import warn_once
from reroll.sandbox.base import Sandbox
from reroll.sandbox.local.isolated import IsolatedSandbox
from reroll.sandbox.local.plain import LocalSandbox, LocalSandboxConfig
from reroll.sandbox.local.rootview import namespaces_unavailable
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.sandbox.local.storage import prune_local_disks
from reroll.sandbox.spec import SandboxSpec


class LocalBackend:
    """The `local` backend: an `IsolatedSandbox`, or where this machine forbids namespaces, the
    plain `LocalSandbox` — said once per process on stderr, as a warning. Its settings are
    `IsolatedSandboxConfig` (the fallback takes their ``ready_timeout_seconds``)."""

    config_model: ClassVar[type[IsolatedSandboxConfig]] = IsolatedSandboxConfig
    """The model of the backend's settings (`reroll.sandbox.base.Backend`)."""

    prune = staticmethod(prune_local_disks)

    def __call__(
        self, spec: SandboxSpec, run_id: str, config: IsolatedSandboxConfig | None = None
    ) -> Sandbox:
        """An unstarted sandbox for `spec` (see the class docstring).

        Raises:
            SandboxError: the plain fallback cannot honour network ``none``.
        """
        config = config or IsolatedSandboxConfig()
        reason = namespaces_unavailable()
        if not reason:
            return IsolatedSandbox(spec, run_id, config)
        if spec.network == "none":
            raise SandboxError(
                "network none needs the isolated local sandbox (or docker), "
                f"and this machine forbids it: {reason}"
            )
        _warn_plain_once(reason)
        plain = LocalSandboxConfig(ready_timeout_seconds=config.ready_timeout_seconds)
        return LocalSandbox(spec, run_id, plain)


local_sandbox = LocalBackend()
"""The `local` backend (``--sandbox local``, the default), as `reroll.sandbox.base.BACKENDS` names it."""


def _warn_plain_once(reason: str) -> None:
    warn_once(
        f"reroll: the local sandbox cannot isolate here ({reason}); running task and agent as plain "
        "host processes (--sandbox local-plain), which can change this machine"
    )
