"""The `Sandbox` class every backend subclasses, and the lazy registry of backends.

A sandbox is one isolated place where one rollout's agent and verifier run. Everything the
controller does inside it goes through `Sandbox` — exec, files, kill, snapshots, verify, each
written once (`reroll.sandbox.sidecar_client.SidecarClient`: an RPC to the sidecar inside) —
never through a backend's transport; a backend supplies only its lifecycle and the host's side
of the network. A backend outside reroll subclasses `Sandbox`, proves itself with
`reroll.conformance`, and is named by its dotted path (``--sandbox mypackage.backends:MySandbox``).
A backend is a class, made from a `reroll.sandbox.spec.SandboxSpec` (never the task), plus a
pydantic model of its settings (`Backend`): a run's ``sandbox_config`` (``--sandbox-config``, a
job file's, config.json's) is parsed by it once, at the edge (`Backend.settings`, called by
`reroll.settings.RolloutSettings`), and travels as that model's instance to the constructor.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError
from reroll_contracts.errors import SandboxBackendError

from reroll.cache import host_ca_bundle
from reroll.sandbox.sidecar_bundle import ENTRYPOINT
from reroll.sandbox.sidecar_client import SidecarClient
from reroll.sandbox.spec import SandboxSpec


class Sandbox(SidecarClient, abc.ABC):
    """A sandbox backend: one isolated place where one rollout's agent and verifier run.

    Every operation inside it — exec, files, kill, snapshots, verify — is `SidecarClient`'s,
    written once (an RPC to the sidecar running in the sandbox; the limits are that module's).
    A backend subclasses this class and supplies only what differs: the lifecycle (`start`,
    which also `connect`s to the sidecar, and `stop`), the host's side of the network
    (`host_address`, `allow_host_port`, `egress`) and `limits_hit`; it may override an
    operation where it has a layer of its own (the ``local`` backend's copy-on-write snapshots).

    Use as an async context manager (``async with backend(spec, run_id) as sandbox``), or call
    `start` and `stop` explicitly; `stop` must run even when the rollout failed. Never rely on
    finalisers. Every method but `host_address`, `allow_host_port`, `egress`, `start` and `stop`
    needs a started sandbox and raises SandboxError ("... is not started") before `start` or
    after `stop`.
    """

    sidecar_program: ClassVar[tuple[str, ...]] = tuple(ENTRYPOINT)
    """The sidecar's program as the sandbox's processes run it (its ``probe`` command probes a
    service's URL or port from inside the sandbox: `reroll.environment.services`): the bundle mounted
    at ``/opt/reroll-sidecar``."""

    async def __aenter__(self) -> Self:
        """`start` the sandbox and return it.

        Raises:
            SandboxError: as `start`.
        """
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """`stop` the sandbox, whether or not the block raised."""
        await self.stop()

    @abc.abstractmethod
    async def host_address(self) -> str:
        """The host address the sandbox's processes reach the host at; the LLM proxy listens there.

        Callable before `start`. ``127.0.0.1`` for `local`; the network's gateway for containers.

        Raises:
            SandboxError: the backend's network cannot be set up.
        """

    @abc.abstractmethod
    async def allow_host_port(self, port: int) -> None:
        """Let the sandbox's processes reach TCP `port` on `host_address` (the LLM proxy's, the
        HTTPS interceptor's); under network policy ``none`` nothing else of the host is reachable.

        Callable before `start`; a no-op where the policy does not filter (``full``, `local`).

        Raises:
            SandboxError: the backend's firewall cannot be changed.
        """

    @abc.abstractmethod
    def egress(self) -> contextlib.AbstractAsyncContextManager[dict[str, str]]:
        """Inside this context the sandbox may reach the internet (to install agents), whatever
        the task's network policy; outside it the policy holds again.

        Yields:
            Environment variables an installer needs to use that access (e.g. a CA bundle).
        """

    @abc.abstractmethod
    async def start(self) -> None:
        """Create the sandbox, start the sidecar in it, `connect` to it and wait until it is ready.

        Raises:
            SandboxError: the sandbox could not start (the cause is in the message); what was
                created is removed again.
        """

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop every process of the sandbox, `disconnect` and delete it. Safe to call twice or
        after a failed start."""

    @abc.abstractmethod
    async def limits_hit(self) -> list[str]:
        """The resource limits of the task's ``environment`` the sandbox's processes hit so far,
        each as a sentence naming the limit (memory: the kernel's OOM killer ended a process;
        disk: the quota is full; pids: a fork was refused); empty when none was, or the backend
        enforces none (`local-plain`). A stopped sandbox may answer what it hit when it stopped.

        Raises:
            SandboxError: not started, or the sandbox died.
        """


SandboxFactory = Callable[[SandboxSpec, str], Sandbox]
"""Makes an unstarted sandbox for a spec and a run id, e.g. a backend class."""
PruneReport = dict[str, list[str]]
"""What a backend's ``prune`` did, by kind: names removed (``containers``, ``volumes``,
``networks``, ``firewall_tables`` …) and, under ``kept``, what it left to rollouts still running."""

BACKENDS: dict[str, str] = {
    "local": "reroll.sandbox.local.backend:local_sandbox",
    "local-plain": "reroll.sandbox.local.plain:LocalSandbox",
    "docker": "reroll.sandbox.docker.backend:DockerSandbox",
}
"""Built-in backend name → ``module:class``, imported only when used."""
WITHOUT_NETWORK_POLICY = frozenset({"local-plain"})
"""Backends that run on the host's network and enforce no ``environment.network`` policy."""

HOST_CA_PATH = "/etc/reroll/host-ca.pem"
"""Where `trust_host_ca` puts the host's CA bundle, below the sandbox root."""
HOST_CA_VARIABLES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
"""The variables that name it: pip's, OpenSSL's (Python's ``ssl``, curl's OpenSSL builds), requests'."""


async def trust_host_ca(sandbox: Sandbox) -> dict[str, str]:
    """Put the host's CA bundle (`reroll.cache.host_ca_bundle`) into the started `sandbox` at
    `HOST_CA_PATH` and return the environment that names it (`HOST_CA_VARIABLES`); empty when the
    host has none. The host may reach the internet through a TLS-intercepting proxy with its own
    CA: installs (`Sandbox.egress`) and, under network ``full``, the agent and the verifier
    (``pip install`` in a test script) need to trust it. Image builds get the same bundle
    (`reroll.sandbox.docker.images.trust_host_ca`).

    Raises:
        SandboxError: not started, or the sandbox died.
    """
    bundle = host_ca_bundle()
    if bundle is None:
        return {}
    path = sandbox.layout.path(HOST_CA_PATH)
    await sandbox.put_file(path, bundle.read_bytes())
    return dict.fromkeys(HOST_CA_VARIABLES, path)


class NoSettings(BaseModel):
    """The settings of a backend class that declares no ``config_model``: none."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Backend:
    """A sandbox backend, loaded (`load_backend`): a class and the pydantic model of its settings.

    A backend class has a ``config_model`` class attribute (a pydantic model; its instance is the
    backend's validated ``sandbox_config``) and is constructed as ``Class(spec, run_id, config)``
    (`spec`: a `reroll.sandbox.spec.SandboxSpec`);
    it may have a classmethod ``prune(config, run_id, *, running)`` returning a `PruneReport`. A
    class outside reroll without ``config_model`` is constructed as ``Class(spec, run_id)`` and
    takes no settings; one without ``prune`` has nothing to sweep.
    """

    name: str
    """The name it was loaded by (a key of `BACKENDS` or a dotted path)."""
    factory: Callable[..., Sandbox]
    """The backend class (for ``local``: `reroll.sandbox.local.backend.local_sandbox`, which
    picks one of two classes)."""
    config_model: type[BaseModel]
    """The model of its settings (`NoSettings` when it declares none)."""

    def settings(self, given: Mapping[str, Any] | None = None) -> BaseModel:
        """`given` (a run's ``sandbox_config`` as a file or the command line has it) parsed by the
        backend's `config_model`: the one place a backend's settings are validated (the edges call
        it: `reroll.settings.RolloutSettings`, ``reroll sandbox prune``); from there on they travel
        as that model's instance, and the fields `given` names are its ``model_fields_set``.

        Raises:
            SandboxBackendError: a setting is unknown or invalid (the message names the backend,
                its config model and the field).
        """
        try:
            return self.config_model.model_validate(dict(given or {}))
        except ValidationError as exc:
            raise SandboxBackendError(
                f"sandbox {self.name!r}: invalid sandbox_config (the settings of "
                f"{self.config_model.__name__}): {exc}"
            ) from exc

    def typed(self, settings: BaseModel | None) -> BaseModel:
        """`settings`, checked to be an instance of this backend's `config_model` (None: its
        defaults); never validated again.

        Raises:
            SandboxBackendError: `settings` are another model's (another backend's settings).
        """
        if settings is None:
            return self.config_model()
        if not isinstance(settings, self.config_model):
            raise SandboxBackendError(
                f"sandbox {self.name!r}: its settings are a {self.config_model.__name__}, "
                f"not a {type(settings).__name__}"
            )
        return settings

    def create(self, spec: SandboxSpec, run_id: str, settings: BaseModel | None = None) -> Sandbox:
        """An unstarted sandbox as `spec` says, made with `settings` (an instance of
        `config_model`, as `settings` parsed it; None: the defaults).

        Raises:
            SandboxBackendError: as `typed`.
        """
        typed = self.typed(settings)
        if self.config_model is NoSettings:
            return self.factory(spec, run_id)
        return self.factory(spec, run_id, typed)

    def prune(
        self, settings: BaseModel | None = None, run_id: str | None = None, *, running: bool = False
    ) -> PruneReport:
        """Remove what killed rollouts of this backend left behind (see each backend's ``prune``).

        Args:
            settings: the backend's settings (an instance of `config_model`; None: the defaults).
            run_id: only this run's leftovers, whether its controller runs or not.
            running: also what rollouts still running use.

        Returns:
            What was removed and kept, by kind; empty for a backend with nothing to sweep.

        Raises:
            SandboxBackendError: as `typed`.
            SandboxError: the backend's sweep failed (e.g. no Docker Engine answers).
        """
        typed = self.typed(settings)
        pruner = getattr(self.factory, "prune", None)
        if pruner is None:
            return {}
        report: PruneReport = pruner(typed, run_id, running=running)
        return report


def load_backend(name: str) -> Backend:
    """The backend `name` stands for, its class imported now, so a typo or a missing package is
    refused before anything is written.

    Args:
        name: a key of `BACKENDS`, or the dotted path of a class outside reroll that subclasses
            `Sandbox` (see `Backend` for its constructor): ``package.module:Class`` or
            ``package.module.Class``.

    Raises:
        SandboxBackendError: an unknown name without a dot (the message lists the known ones), a module
            that cannot be imported (for a built-in backend: what to install), no such class, or
            a ``config_model`` that is not a pydantic model.
    """
    target = BACKENDS.get(name)
    if target is None:
        if "." not in name and ":" not in name:
            raise SandboxBackendError(
                f"unknown sandbox backend {name!r}; known: {', '.join(sorted(BACKENDS))}, "
                "or the dotted path of a Sandbox class (package.module:Class)"
            )
        target = name
    module_name, colon, class_name = target.partition(":")
    if not colon:
        module_name, _, class_name = target.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if name in BACKENDS:
            raise SandboxBackendError(f"sandbox backend {name!r} needs a missing package: {exc}") from exc
        raise SandboxBackendError(
            f"sandbox backend {name!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    factory = getattr(module, class_name, None)
    if not callable(factory):
        raise SandboxBackendError(
            f"sandbox backend {name!r}: module {module_name!r} has no class {class_name!r}"
        )
    config_model = getattr(factory, "config_model", NoSettings)
    if not (isinstance(config_model, type) and issubclass(config_model, BaseModel)):
        raise SandboxBackendError(
            f"sandbox backend {name!r}: its config_model {config_model!r} is not a pydantic model"
        )
    return Backend(name, factory, config_model)


def create_sandbox(
    backend: str, spec: SandboxSpec, run_id: str, settings: BaseModel | None = None
) -> Sandbox:
    """Create (not start) a sandbox of the named backend as `spec` says.

    Args:
        backend: a key of `BACKENDS` or a dotted path (see `load_backend`).
        spec: what the sandbox provides (`reroll.rollout.sandbox_spec.sandbox_spec` of a task).
        run_id: an id unique to this rollout, used to label what the sandbox creates.
        settings: the backend's settings, an instance of its config model (`Backend.settings`
            parses them; ``RolloutSettings.sandbox_config`` holds them) [default: its defaults].

    Raises:
        SandboxBackendError: as `load_backend` and `Backend.typed`.
    """
    return load_backend(backend).create(spec, run_id, settings)
