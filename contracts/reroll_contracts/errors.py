"""The exception tree of reroll, drawn once for the controller, the proxy and the sidecar.

Every error reroll raises on purpose derives from `RerollError`, is defined here, and names the file,
step or cause it is about. Each class carries two class attributes: `error_category`, the stable
word result.json and summary.json record in ``error_category`` when it ends a rollout (never a
Python class name), and `retryable`, whether a job runs that rollout again. The CLI prints the
message as it is and exits with code 2 for a `ConfigError` (refused before anything is written),
1 for any other::

    class                        category        retried  raised when
    RerollError                  internal        no       (base; an exception outside the tree too)
    ├── ConfigError              config          no       what was asked cannot run (a bad argument)
    │   ├── TaskError                                     a task folder is missing or invalid
    │   ├── AgentError                                    unknown agent, or an invalid agents.yaml
    │   ├── ModelError                                    unknown model spec or script, missing key
    │   ├── JobError                                      a job file or folder is invalid
    │   ├── FaultPlanError                                a fault plan (--faults) is missing or invalid
    │   ├── ProxyConfigError                              the proxy's config file is invalid
    │   ├── SandboxBackendError                           unknown sandbox backend, or its package missing
    │   ├── ImageUnavailableError                         a FROM image is neither local nor pullable
    │   ├── RunFolderError                                a run folder lacks a file or one is corrupt
    │   │   ├── TrajectoryFormatError                     a trajectory line is not an exchange
    │   │   ├── ExportError                               a run cannot be exported (reroll export)
    │   │   └── StoreError                                a job's learner store is missing or corrupt
    │   ├── TrialError                                    a trial (file, config, User callable) is invalid
    │   ├── UntrustedCodeError                            a run folder names host code not trusted again
    │   └── ViewError                                     reroll view cannot write its site
    ├── RequestError             agent_error     no       an agent's request cannot be served (HTTP 400)
    │   ├── TranslationError                              no counterpart in the upstream's format
    │   │   └── UntranslatableError                       a part of a body has no counterpart
    │   └── RequestShapeError                             a body lacks what its format needs
    ├── AgentInstallError        agent_error     no       the agent's install script failed
    ├── UserCallbackError        user_error      no       a trial's User callback raised or returned junk
    ├── InfrastructureError      infrastructure  yes      a proxy or model server did not start or died
    │   ├── UpstreamError                                 the proxy's upstream is unreachable or broke off
    │   └── SandboxError                                  the sandbox or its sidecar did not start / died
    │       ├── ImageBuildError                           a Docker image could not be built
    │       ├── SidecarError                              an RPC to the sidecar failed
    │       │   └── SidecarUnavailable                    no connection, or not ready in time
    │       ├── SidecarRequestError                       in the sidecar: a request it cannot serve
    │       │   ├── VerifyError                           PrepareVerify / Verify
    │       │   └── SnapshotError                         Snapshot / Restore
    │       └── ToolError                                 in the sidecar: find or tar failed
    ├── TaskEnvironmentError     environment_error no     a task's service or its state failed
    │   ├── ServiceNotReadyError                          a service never passed its readiness probe
    │   │                                                 (or exited) before the agent could start
    │   ├── ServiceCrashedError                           a service exited while the agent ran
    │   └── EnvironmentStateError                         snapshot / restore / query of the
    │                                                     environment's state failed
    ├── VerifierError            verifier_error  no       the verifier left no valid reward, or
    │                                                     crashed before its tests ran (a tool missing)
    │   ├── NeedsInternetError   needs_internet  no       its test script could not download what it
    │   │                                                 runs: the sandbox has no internet
    │   └── QuiesceError                                  the agent's processes outlived the time
    │                                                     limit of the freeze-and-kill before verify
    └── VerifyLeftoverError      verifier_error  no       a soft verify changed what its fence cannot
                                                          undo (the trial ends)

Raised outside the controller: `FaultPlanError`, `ProxyConfigError`, `TrajectoryFormatError`,
`TranslationError`, `UntranslatableError` and `UpstreamError` (answered as a 502, never
escaping) by `reroll_proxy`; `SidecarRequestError` (its `kind`
picks the gRPC status), `VerifyError`, `SnapshotError` and `ToolError` by `reroll_sidecar`, which
the controller receives as a `SidecarError`; `RequestShapeError` by the scripted model server.

A rollout also ends with categories no exception carries: ``timeout`` (the agent's budget ran out;
it and BenchFlow's ``idle_timeout`` mark a run ``reroll continue`` takes), ``step_limit`` (the run served
its ``--max-steps`` steps; ``reroll continue`` takes it too), ``replay_only`` (a
``--replay-only`` continuation stopped at its cut point), ``divergence`` (the proxy aborted on
strict divergence: a replayed request left the recorded rails), ``agent_error`` (the agent exited
non-zero), ``resource_limit`` (the sandbox hit a limit of the task's ``environment``: the
kernel's OOM killer struck at ``memory_mb``, the ``storage_mb`` disk quota filled up, or — on
`local` — a fork was refused at ``pids_max`` or ``/tmp`` or ``/dev/shm`` filled up; not
retried, the same agent would hit it again). Any exception outside this tree ends a rollout
with status ``error``, category ``internal`` and its traceback in ``error.txt`` of the run folder.

The proxy and the sidecar import this module without loading the controller: it imports nothing,
and ``reroll/__init__.py`` loads its submodules lazily, so the sandbox image ships only
``reroll/__init__.py`` and this file beside ``reroll_sidecar``. Third-party exceptions (grpc,
aiohttp, pydantic) are converted at the boundary with ``raise X(...) from exc``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

ErrorCategory = Literal[
    "config",
    "agent_error",
    "infrastructure",
    "verifier_error",
    "needs_internet",
    "environment_error",
    "divergence",
    "timeout",
    "idle_timeout",
    "resource_limit",
    "replay_only",
    "step_limit",
    "user_error",
    "internal",
]
"""The words result.json's ``error_category`` holds for runs reroll writes (see the module docstring)."""

SidecarRequestKind = Literal["invalid", "precondition", "not_found", "failed"]
"""Why the sidecar cannot serve a request: a bad argument, a missing earlier step (no verification
baseline), a missing thing (snapshot, test script), or a tool that failed."""


class RerollError(Exception):
    """Base class of every error reroll raises on purpose."""

    error_category: ClassVar[ErrorCategory] = "internal"
    """What result.json's ``error_category`` says when this error ends a rollout."""
    retryable: ClassVar[bool] = False
    """Whether a job runs a rollout that ended with this error again (``max_retries``)."""


class ConfigError(RerollError):
    """What was asked cannot run: fix the input. Never retried; the CLI exits with code 2."""

    error_category = "config"


class TaskError(ConfigError):
    """A task folder is missing or invalid."""


class AgentError(ConfigError):
    """An agent name is unknown, or an agent declaration is invalid."""


class ModelError(ConfigError):
    """A model spec cannot be resolved to a live upstream (unknown provider, no script, no key)."""


class JobError(ConfigError):
    """A job file is missing or invalid, or a job folder cannot be resumed."""


class FaultPlanError(ConfigError):
    """A fault plan file is missing or invalid (the message names it)."""


class ProxyConfigError(ConfigError):
    """The proxy's config file is missing, not JSON, or invalid; the message names the file."""


class SandboxBackendError(ConfigError):
    """A sandbox backend name is unknown, its optional package is not installed, or a dotted
    path (an out-of-tree backend) names no importable class."""


class RunFolderError(ConfigError):
    """A run folder is incomplete or one of its files is corrupt."""


class TrajectoryFormatError(RunFolderError):
    """A trajectory line is not valid JSON or not an exchange; the message names file and line."""


class ExportError(RunFolderError):
    """A run, job or branch tree cannot be exported (``reroll export``): not one of the three, an
    unknown API format in its trajectory, or a result its target format refuses."""


class StoreError(RunFolderError):
    """A job's learner store (``<job>/store/``: its head, a generation's manifest, a blob) is
    missing or corrupt, or a generation asked for does not exist; the message names the file."""


class TrialError(ConfigError):
    """A trial is invalid: its YAML file, a scene's roles or turns, or its User callable."""


class UntrustedCodeError(ConfigError):
    """A recorded run's config.json names code that would run on the host (a trial's User, an
    out-of-tree sandbox backend) and the user did not name it again (``--trust``)."""


class ViewError(ConfigError):
    """``reroll view`` cannot write its site: the output folder cannot be created or written (the
    message names it and the cause)."""


class RequestError(RerollError):
    """An agent's request cannot be served (the proxy or the scripted model answers HTTP 400)."""

    error_category = "agent_error"


class TranslationError(RequestError):
    """A request cannot be translated to the upstream's format (an unsupported pair of formats, or
    a part with no counterpart); the message says which."""


class UntranslatableError(TranslationError):
    """A part of a body has no counterpart in the other format (the message names it)."""


class RequestShapeError(RequestError):
    """A request body lacks what its format needs (the message says what)."""


class AgentInstallError(RerollError):
    """The agent's install script failed in the sandbox (the message carries its output's end)."""

    error_category = "agent_error"


class UserCallbackError(RerollError):
    """A trial's User callback (`reroll.trials.users`) raised, or returned something but a string or None."""

    error_category = "user_error"


class InfrastructureError(RerollError):
    """Something under the agent failed: a proxy, model server or sandbox did not start or died.

    A rollout that fails this way gets ``error_category: infrastructure``; jobs retry it.
    """

    error_category = "infrastructure"
    retryable = True


class UpstreamError(InfrastructureError):
    """The proxy's upstream (the model provider) could not be reached, or its answer broke off.

    Raised by a `reroll_proxy.upstream.Upstream`; the proxy answers the agent 502 and records it.
    """


class SandboxError(InfrastructureError):
    """A sandbox could not be started, or its sidecar failed."""


class ImageBuildError(SandboxError):
    """A Docker image could not be built; the message names the step and carries its output's end."""


class ImageUnavailableError(ConfigError):
    """A task's Dockerfile starts ``FROM`` an image that is not local and cannot be pulled; the
    message names it and the remedies (build or tag it locally, or map it with ``--image-map``).
    Not retried: another attempt would fail the same way."""


class SidecarError(SandboxError):
    """An RPC to the sidecar failed; the message says which one, with the gRPC status and details."""


class SidecarUnavailable(SidecarError):
    """The sidecar cannot be reached (connection refused, socket missing, not ready in time)."""


class SidecarRequestError(SandboxError):
    """In the sidecar: a request it cannot serve; `kind` picks the gRPC status it answers with."""

    def __init__(self, kind: SidecarRequestKind, message: str) -> None:
        super().__init__(message)
        self.kind: SidecarRequestKind = kind
        """Why (see `SidecarRequestKind`)."""


class VerifyError(SidecarRequestError):
    """In the sidecar: a PrepareVerify or Verify request cannot be served."""


class SnapshotError(SidecarRequestError):
    """In the sidecar: a Snapshot or Restore request is invalid, or find, tar or a clone failed."""


class ToolError(SandboxError):
    """In the sidecar: find or tar failed or took too long, or an archive is damaged."""


class TaskEnvironmentError(RerollError):
    """The task's environment — its services or their state — failed (not reroll's engine: a
    service that never gets healthy fails the same way on a retry, so it is not retried)."""

    error_category = "environment_error"


class ServiceNotReadyError(TaskEnvironmentError):
    """A service of the task did not pass its readiness probe within the readiness timeout, or
    exited before it did; the message names the service, its probe and the last lines of its log."""


class ServiceCrashedError(TaskEnvironmentError):
    """A service of the task exited while the agent ran; the message names it and its log's tail."""


class EnvironmentStateError(TaskEnvironmentError):
    """Snapshot, restore or query of the environment's state (``environment.state``) failed, or a
    checkpoint's layers do not belong together."""


class VerifierError(RerollError):
    """The verifier ran but left no valid reward."""

    error_category: ClassVar[ErrorCategory] = "verifier_error"


class NeedsInternetError(VerifierError):
    """The test script tried to download what it runs (uv, pytest, a package) and the sandbox has
    no route to the internet: the task cannot be scored here, whatever the agent did."""

    error_category: ClassVar[ErrorCategory] = "needs_internet"


class VerifyLeftoverError(RerollError):
    """A soft verify left something it could not undo (a file outside the agent's folders changed
    or vanished, or the clean-up after it failed): the sandbox may hold the hidden tests, so the
    trial ends. Not a `VerifierError`, which a trial's round records and goes on after."""

    error_category = "verifier_error"


class QuiesceError(VerifierError):
    """The agent's processes were not all stopped and killed within the quiesce time limit (raised
    by ``reroll_sidecar.quiesce``; the controller receives it from Kill as an ABORTED status)."""


def error_category(exc: BaseException) -> ErrorCategory:
    """The ``error_category`` of a rollout that `exc` ended: its class's, or ``internal``."""
    return exc.error_category if isinstance(exc, RerollError) else "internal"


def _subclasses(cls: type[RerollError]) -> list[type[RerollError]]:
    return [cls] + [sub for direct in cls.__subclasses__() for sub in _subclasses(direct)]


RETRIED_CATEGORIES: frozenset[str] = frozenset(
    cls.error_category for cls in _subclasses(RerollError) if cls.retryable
)
"""The categories of the retryable classes: a job runs a rollout whose result.json has one again."""
