"""The exception tree of reroll.

Every error a user can cause or meet derives from `RerollError`; each names the file, step or
cause it is about, so the CLI prints it as it is and exits with a non-zero code::

    RerollError
    ├── TaskError          a task folder is missing, or its task.md / task.toml is invalid
    ├── AgentError         unknown agent name, or the agent's install failed
    ├── ModelError         unknown model spec, or the provider's credentials are missing
    ├── RunFolderError     a run folder is missing a file, or a file in it is corrupt
    ├── JobError           a job file is missing or invalid, or a job folder has no job.json
    ├── FaultPlanError     a fault plan file (--faults) is missing or invalid
    ├── InfrastructureError  a proxy or model server could not start or died (jobs retry these)
    │   └── SandboxError     the sandbox could not start, or its sidecar failed / died
    ├── VerifierError      the verifier produced no reward.txt / reward.json, or an invalid one
    └── DivergenceError    strict divergence: a replayed request left the recorded rails

Third-party exceptions (grpc, aiohttp, pydantic) are converted at the boundary with
``raise X(...) from exc``.
"""

from __future__ import annotations


class RerollError(Exception):
    """Base class of every error reroll raises on purpose."""


class TaskError(RerollError):
    """A task folder is missing or invalid."""


class AgentError(RerollError):
    """An agent is unknown or could not be installed."""


class ModelError(RerollError):
    """A model spec cannot be resolved to a live upstream."""


class FaultPlanError(RerollError):
    """A fault plan file is missing or invalid (the message names it)."""


class RunFolderError(RerollError):
    """A run folder is incomplete or one of its files is corrupt."""


class JobError(RerollError):
    """A job file is missing or invalid, or a job folder cannot be resumed."""


class InfrastructureError(RerollError):
    """Something under the agent failed: a proxy, model server or sandbox did not start or died.

    A rollout that fails this way gets ``error_category: infrastructure``; jobs retry it.
    """


class SandboxError(InfrastructureError):
    """A sandbox could not be started, or its sidecar failed."""


class VerifierError(RerollError):
    """The verifier ran but left no valid reward."""


class DivergenceError(RerollError):
    """A replayed request differed from the recording under the strict policy."""
