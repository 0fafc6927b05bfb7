"""The `Sandbox` protocol every backend implements, and the lazy registry of backends.

A sandbox is one isolated place where one rollout's agent and verifier run. Everything the
controller does inside it goes through this protocol — exec, files, kill, snapshots, verify —
never through a backend's transport (reroll's own backends talk to a sidecar over gRPC; see
`reroll.sandbox.sidecar_sandbox`, the implementation they share). A backend outside reroll
implements the protocol, proves it with `reroll.conformance`, and is named by its
dotted path (``--sandbox mypackage.backends:MySandbox``). A backend is a class, made from a
`reroll.sandbox.spec.SandboxSpec` (never the task), plus a pydantic
model of its settings (`Backend`): a run's ``sandbox_config`` (``--sandbox-config``, a job
file's, config.json's) is validated by it and handed to the constructor.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, Unpack

from pydantic import BaseModel, ConfigDict, ValidationError
from reroll_contracts.errors import SandboxBackendError
from reroll_contracts.hardening import HardeningOptions

from reroll.cache import host_ca_bundle
from reroll.sandbox.results import (
    ExecOptions,
    ExecResult,
    HardeningReport,
    VerifyBaseline,
    VerifyOutcome,
    VerifyScript,
)
from reroll.sandbox.spec import SandboxSpec

SANDBOX_HOSTNAME = "sandbox"
"""The hostname of every container and isolated local sandbox, so what an agent sees does not
change between the sandboxes of a run's lineage (record, replay, continue)."""


@dataclass(frozen=True)
class SandboxLayout:
    """Where things live inside a sandbox, as paths its processes see.

    A container uses the usual absolute paths (``/app``, ``/logs``); the `local` backend puts
    them under its root folder. Processes find them in the environment from `env()`.
    """

    root: str
    """The sandbox root: ``/`` in a container, a private folder for `local`."""
    workspace: str
    """The agent's working directory (``/app``)."""
    logs_dir: str
    """Holds ``agent/`` and ``verifier/`` (``/logs``); the verifier writes ``verifier/reward.txt``."""
    home: str
    """HOME of the agent's processes."""
    agents_dir: str
    """Where agents are installed, one folder per install key, kept across rollouts."""
    agent_user: str = ""
    """The user the agent runs as (``agent`` in containers); empty = the sidecar's own user."""
    image_env: Mapping[str, str] = field(default_factory=dict)
    """The image's own ``ENV`` (``docker image inspect``'s ``Config.Env``): the base of every
    phase's environment (agent, oracle, verifier), as in the task's own harness; empty where the
    sandbox runs no image."""

    def path(self, relative: str) -> str:
        """A path under the sandbox root, e.g. ``path("verifier")`` → ``/verifier``."""
        return str(Path(self.root) / relative.lstrip("/"))

    def env(self) -> dict[str, str]:
        """Environment variables every process in the sandbox gets."""
        return {
            "HOME": self.home,
            "REROLL_SANDBOX_ROOT": self.root,
            "REROLL_WORKSPACE": self.workspace,
            "REROLL_LOGS_DIR": self.logs_dir,
        }


class Sandbox(Protocol):
    """A sandbox backend: one isolated place where one rollout's agent and verifier run.

    Use as an async context manager (``async with backend(spec, run_id) as sandbox``), or call
    `start` and `stop` explicitly; `stop` must run even when the rollout failed. Never rely on
    finalisers. Every method but `host_address`, `allow_host_port`, `egress`, `start` and `stop`
    needs a started sandbox and raises SandboxError ("... is not started") before `start` or after `stop`.

    Limits of reroll's own backends (the sidecar's): exec output arrives in chunks of at most
    64 KiB and is also kept in memory for the result: whole, or only the last
    `reroll.sandbox.results.STREAMED_TAIL_BYTES` of each stream when the caller takes every
    chunk through ``on_output`` (the agent's run: its output goes to the run folder); files
    move in 1 MiB chunks, held whole in memory, each transfer within 120 s; a snapshot or
    restore within 660 s.
    """

    layout: SandboxLayout
    """Paths inside the sandbox, and the environment variables that name them (`SandboxLayout.env`)."""

    async def __aenter__(self) -> Self:
        """`start` the sandbox and return it.

        Raises:
            SandboxError: as `start`.
        """
        ...

    async def __aexit__(self, *exc_info: object) -> None:
        """`stop` the sandbox, whether or not the block raised."""
        ...

    async def host_address(self) -> str:
        """The host address the sandbox's processes reach the host at; the LLM proxy listens there.

        Callable before `start`. ``127.0.0.1`` for `local`; the network's gateway for containers.

        Raises:
            SandboxError: the backend's network cannot be set up.
        """
        ...

    async def allow_host_port(self, port: int) -> None:
        """Let the sandbox's processes reach TCP `port` on `host_address` (the LLM proxy's, the
        HTTPS interceptor's); under network policy ``none`` nothing else of the host is reachable.

        Callable before `start`; a no-op where the policy does not filter (``full``, `local`).

        Raises:
            SandboxError: the backend's firewall cannot be changed.
        """
        ...

    def egress(self) -> contextlib.AbstractAsyncContextManager[dict[str, str]]:
        """Inside this context the sandbox may reach the internet (to install agents), whatever
        the task's network policy; outside it the policy holds again.

        Yields:
            Environment variables an installer needs to use that access (e.g. a CA bundle).
        """
        ...

    async def start(self) -> None:
        """Create the sandbox, start what runs commands in it and wait until it is ready.

        Raises:
            SandboxError: the sandbox could not start (the cause is in the message); what was
                created is removed again.
        """
        ...

    async def stop(self) -> None:
        """Stop every process of the sandbox and delete it. Safe to call twice or after a failed start."""
        ...

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
                the result may then hold only the end of each stream (reroll's backends keep
                the last `reroll.sandbox.results.STREAMED_TAIL_BYTES`).
            **options: working folder, environment, user, timeout, stdin, service (`ExecOptions`).

        Returns:
            The exit code (127 for a program that does not exist, with the error on stderr; the
            negative signal number when killed, -9 after a timeout), the stdout and stderr
            (whole without `on_output`), whether it timed out, and its duration in seconds.

        Raises:
            SandboxError: not started, the command could not be started (e.g. a nonexistent
                `cwd` or `user`), or the sandbox died.
        """
        ...

    async def limits_hit(self) -> list[str]:
        """The resource limits of the task's ``environment`` the sandbox's processes hit so far,
        each as a sentence naming the limit (memory: the kernel's OOM killer ended a process;
        disk: the quota is full; pids: a fork was refused); empty when none was, or the backend
        enforces none (`local-plain`). A stopped sandbox may answer what it hit when it stopped.

        Raises:
            SandboxError: not started, or the sandbox died.
        """
        ...

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> int:
        """Write `data` to the absolute `path` in the sandbox, atomically, creating parent folders.

        Args:
            path: absolute path in the sandbox.
            data: the file's whole content.
            mode: permission bits, e.g. ``0o755``.

        Returns:
            The size written, in bytes.

        Raises:
            SandboxError: not started, a relative path, or no permission.
        """
        ...

    async def get_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read the file at the absolute `path` in the sandbox.

        Args:
            path: absolute path in the sandbox.
            max_bytes: read at most this many bytes (the start of the file); None: all of it.

        Returns:
            The file's whole content (its first `max_bytes` bytes).

        Raises:
            FileNotFoundError: the file does not exist (the message names `path`).
            SandboxError: not started, or any other failure (no permission; a symlink, never
                followed; not a regular file: a folder, a FIFO, never waited on; larger than
                1 GiB without `max_bytes`).
        """
        ...

    async def upload_dir(self, source: Path, destination: str) -> int:
        """Copy every file under host folder `source` to `destination` in the sandbox, keeping modes.

        Returns:
            The number of files copied.

        Raises:
            SandboxError: as `put_file`.
        """
        ...

    async def manifest(self, root: str) -> dict[str, str]:
        """Hash every regular file under the absolute folder `root` (the workspace manifest),
        by the backend's own code (no tool of the image), following no symlink and opening
        nothing but regular files.

        Returns:
            ``{relative path: sha256 hex}``, sorted by path; a symlink (to a file or a folder) as
            ``"symlink:<target>"``, a FIFO, socket or device as ``"fifo:"``, ``"socket:"``,
            ``"device:"`` (never opened), a file that cannot be read as ``"unreadable:<why>"``;
            bytecode caches (``__pycache__/``, ``*.pyc``) are left out.

        Raises:
            VerifierError: the hashing ran out of time (the agent controls the tree).
            SandboxError: `root` is not a folder, not started, or the sandbox died.
        """
        ...

    async def kill(self, user: str = "", *, spare_services: bool = False) -> int:
        """Quiesce the agent's processes, then SIGKILL the process groups started through `exec`
        for `user` (empty: for every user).

        Quiesce freezes, then kills, every process the agent left, whatever it does to escape
        (fork storms, ``setsid``, double forks): with an empty `user` every process `exec`
        started and all their descendants; where the backend runs as root and `user` is
        another, non-root user, every process of that user. None is left when this returns.
        `spare_services` (the agent's quiesce): every process `exec` started and all their
        descendants, and every process of `user`, but the task's services (``exec`` with
        ``service``) and what they forked, which live on.

        Returns:
            How many process groups were signalled.

        Raises:
            QuiesceError: processes were still alive after the backend's time limit.
            SandboxError: not started, or the sandbox died.
        """
        ...

    async def snapshot(self, name: str, paths: list[str] | None = None) -> int:
        """Save `paths` (absolute, in the sandbox; default: the workspace) as snapshot `name`,
        replacing one of that name.

        Returns:
            The snapshot's size in bytes.

        Raises:
            SandboxError: not started, a bad name or path, or the snapshot could not be stored.
        """
        ...

    async def restore(self, name: str) -> list[str]:
        """Restore snapshot `name` exactly: contents, modes, owners, symlinks, hard links, and
        deletions of what came since.

        Returns:
            The paths restored (those given to `snapshot`).

        Raises:
            SandboxError: not started, no snapshot of that name, or the restore failed.
        """
        ...

    async def prepare_verify(
        self, hardening: HardeningOptions, env: Mapping[str, str], pytest_plugins: Sequence[str] = ()
    ) -> VerifyBaseline:
        """Record the verification baseline before the agent runs (replacing an earlier one):
        the start-up hooks in the workspace and HOME, a snapshot of the build-config files, and
        the trusted pytest plugins of the sandbox's ``python3``.

        Args:
            hardening: the task's hardening options, which the later `verify` applies.
            env: the environment in which the sandbox's ``python3`` is found (PATH).
            pytest_plugins: the plugins the task declares, which the test script's pytest loads.

        Raises:
            SandboxError: not started, or a scan or the snapshot failed.
        """
        ...

    async def verify(
        self,
        run: VerifyScript,
        *,
        on_output: Callable[[str, bytes], None] | None = None,
        on_hardening: Callable[[HardeningReport], None] | None = None,
    ) -> VerifyOutcome:
        """Harden the sandbox as `prepare_verify` recorded (kill the agent's processes, undo
        planted build config and hooks, delete old reward files), run the test script in a
        clean environment as root, and read its reward.

        Args:
            run: the script, its folders, environment, timeout and policy (`VerifyScript`).
            on_output: called with ``("stdout" | "stderr", chunk)`` for every chunk as it arrives;
                the outcome may then hold only the end of each stream (as `exec`).
            on_hardening: called with the hardening report once it is done, before the script runs.

        Returns:
            The hardening report, the script's exit, output and reward (or why there is none).

        Raises:
            FileNotFoundError: the test script is missing (the message names it).
            SandboxError: not started, `prepare_verify` did not run before, or the sandbox died.
        """
        ...


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

    def settings(self, config: Mapping[str, Any] | None = None) -> BaseModel:
        """`config` (a run's ``sandbox_config``) validated by the backend's `config_model`.

        Raises:
            SandboxBackendError: a setting is unknown or invalid (the message names the backend,
                its config model and the field).
        """
        try:
            return self.config_model.model_validate(dict(config or {}))
        except ValidationError as exc:
            raise SandboxBackendError(
                f"sandbox {self.name!r}: invalid sandbox_config (the settings of "
                f"{self.config_model.__name__}): {exc}"
            ) from exc

    def create(self, spec: SandboxSpec, run_id: str, config: Mapping[str, Any] | None = None) -> Sandbox:
        """An unstarted sandbox as `spec` says, made with `config` validated (see `settings`).

        Raises:
            SandboxBackendError: as `settings`.
        """
        settings = self.settings(config)
        if self.config_model is NoSettings:
            return self.factory(spec, run_id)
        return self.factory(spec, run_id, settings)

    def prune(
        self, config: Mapping[str, Any] | None = None, run_id: str | None = None, *, running: bool = False
    ) -> PruneReport:
        """Remove what killed rollouts of this backend left behind (see each backend's ``prune``).

        Args:
            config: the backend's settings (validated as by `settings`).
            run_id: only this run's leftovers, whether its controller runs or not.
            running: also what rollouts still running use.

        Returns:
            What was removed and kept, by kind; empty for a backend with nothing to sweep.

        Raises:
            SandboxBackendError: as `settings`.
            SandboxError: the backend's sweep failed (e.g. no Docker Engine answers).
        """
        settings = self.settings(config)
        pruner = getattr(self.factory, "prune", None)
        if pruner is None:
            return {}
        report: PruneReport = pruner(settings, run_id, running=running)
        return report


def load_backend(name: str) -> Backend:
    """The backend `name` stands for, its class imported now, so a typo or a missing package is
    refused before anything is written.

    Args:
        name: a key of `BACKENDS`, or the dotted path of a class outside reroll that implements
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
    backend: str, spec: SandboxSpec, run_id: str, config: Mapping[str, Any] | None = None
) -> Sandbox:
    """Create (not start) a sandbox of the named backend as `spec` says.

    Args:
        backend: a key of `BACKENDS` or a dotted path (see `load_backend`).
        spec: what the sandbox provides (`reroll.rollout.sandbox_spec.sandbox_spec` of a task).
        run_id: an id unique to this rollout, used to label what the sandbox creates.
        config: the backend's settings (a run's ``sandbox_config``) [default: none, its defaults].

    Raises:
        SandboxBackendError: as `load_backend` and `Backend.settings`.
    """
    return load_backend(backend).create(spec, run_id, config)
