"""What the `Sandbox` operations take and return: plain values, whatever the backend.

`ExecOptions` and `VerifyScript` are written once here; the sandbox's operations
(`reroll.sandbox.sidecar_client.SidecarClient`) turn them into the sidecar's messages unchanged
(`reroll.sandbox.sidecar_wire`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from reroll_contracts.graded import AggregatePolicy, GradedReward

STREAMED_TAIL_BYTES = 64 * 1024
"""What `Sandbox.exec` and `Sandbox.verify` of reroll's backends keep of each output stream in
their result when the caller takes every chunk through ``on_output``: its last 64 KiB, in bytes
(the caller streams the rest to a file, so an agent that prints gigabytes costs the controller
no memory). Without ``on_output`` the result holds the whole output."""


class OutputTail:
    """The last `limit` bytes of a stream, kept as its chunks arrive (all of them when `limit` is None)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._kept = bytearray()

    def add(self, chunk: bytes) -> None:
        """Append `chunk`, then drop what is older than the last `limit` bytes."""
        self._kept += chunk
        if self.limit is not None and len(self._kept) > self.limit:
            del self._kept[: len(self._kept) - self.limit]

    def value(self) -> bytes:
        """What is kept."""
        return bytes(self._kept)


@dataclass(frozen=True)
class ExecResult:
    """The outcome of `Sandbox.exec`."""

    exit_code: int
    """The exit code, or the negative signal number when killed by a signal (-9 after a timeout)."""
    stdout: bytes
    """The whole stdout; its last `STREAMED_TAIL_BYTES` when the caller passed ``on_output``."""
    stderr: bytes
    """The whole stderr; its last `STREAMED_TAIL_BYTES` when the caller passed ``on_output``."""
    timed_out: bool
    """Whether the process group was killed because the timeout elapsed."""
    duration_seconds: float
    """Wall-clock time from the request to the exit, as the client saw it."""

    def output_text(self) -> str:
        """Stdout followed by stderr, decoded as UTF-8 (invalid bytes replaced)."""
        return (self.stdout + self.stderr).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class VerifyBaseline:
    """What `Sandbox.prepare_verify` recorded before the agent ran."""

    hooks: list[str]
    """Start-up hook files that existed (absolute paths in the sandbox)."""
    snapshot_paths: list[str]
    """What the baseline snapshot holds (build config and hooks); empty when none was needed."""
    pytest_plugins: list[str]
    """The trusted pytest plugins of the sandbox's ``python3`` (root's alone), sorted; empty with
    ``plugin_autoload`` or without a ``python3``."""


class ExecOptions(TypedDict, total=False):
    """How `Sandbox.exec` runs a command (keyword arguments; each has a default)."""

    cwd: str
    """Absolute working directory in the sandbox; empty (default) = the backend's default."""
    env: Mapping[str, str] | None
    """Environment variables of the child."""
    inherit_env: bool
    """True (default): the backend's base environment updated by `env`; False: exactly `env`."""
    user: str
    """Run as this user (e.g. ``layout.agent_user``); empty (default) = the backend's own user."""
    timeout_seconds: float
    """Kill the whole process group after this many seconds; 0 (default) = no timeout."""
    stdin: bytes
    """Bytes fed to the child's stdin, which is then closed (default: none)."""
    service: bool
    """A task's service (`reroll.environment.services`): runs as the backend's own user (`user` must
    be empty) and outlives `Sandbox.kill` of the agent's user and the verify's hardening; only
    `kill` of every user, the cancel or the sandbox's end stops it. Default False."""


@dataclass(frozen=True)
class VerifyScript:
    """One run of a task's test script, as `Sandbox.verify` takes it, to become the sidecar's
    ``VerifyRequest`` (`reroll.sandbox.sidecar_wire.verify_request`). What to run, where and how
    is the caller's policy (`reroll.rollout.verify.script_verifier`); the sandbox only runs it."""

    verifier_dir: str
    """The folder in the sandbox holding the verifier's files; the script runs there."""
    script: str
    """The test script, relative to `verifier_dir` (``test.sh``)."""
    reward_dir: str
    """Where the script writes ``reward.txt`` or ``reward.json``."""
    env: Mapping[str, str]
    """The script's base environment; cleaned, then the hardening variables are added."""
    timeout_seconds: float
    """Kill the script's process group after this many seconds; 0 = no timeout."""
    soft: bool = False
    """A soft verify (between a trial's rounds): the agent's processes are killed, the script
    runs in the same clean environment, but planted build config and start-up hooks are left as
    the agent left them (it goes on working afterwards)."""
    aggregate_policy: AggregatePolicy | None = None
    """verifier.md's ``outputs.aggregate_policy``, which makes a graded reward.json's items one
    reward (`reroll_contracts.graded`); None: none declared."""
    keep_agent_processes: bool = False
    """Keep what the agent left running alive for the script (Harbor's semantics): frozen during
    the hardening, the workspace then handed to root when the agent has a user of its own;
    killed after the script."""
    own_network: bool = False
    """Run the script in a network namespace with only loopback (the verifier's policy ``none``,
    stricter than the agent's); it is not run where that namespace cannot be made."""
    cwd: str = ""
    """The script's working folder (absolute, in the sandbox); empty: `verifier_dir`."""
    image_env: Mapping[str, str] = field(default_factory=dict)
    """The image's own ENV (`reroll.sandbox.layout.SandboxLayout.image_env`): under `env` and
    not cleaned (an image's PYTHONPATH stays); empty: none."""


@dataclass(frozen=True)
class HardeningReport:
    """What `Sandbox.verify`'s hardening did; the run folder's ``verifier/hardening.json``."""

    killed_groups: int
    restored: list[str]
    deleted: list[str]
    notes: list[str] = field(default_factory=list)
    """Symlinked folders replaced, non-regular files skipped, a hardening step that failed."""


@dataclass(frozen=True)
class VerifyOutcome:
    """The outcome of `Sandbox.verify`."""

    hardening: HardeningReport
    exit_code: int
    """The test script's exit code, or the negative signal number (-9 after a timeout)."""
    timed_out: bool
    stdout: bytes
    """The script's stdout; its last `STREAMED_TAIL_BYTES` when the caller passed ``on_output``."""
    stderr: bytes
    """The script's stderr; its last `STREAMED_TAIL_BYTES` when the caller passed ``on_output``."""
    reward_file: str
    """``reward.txt`` or ``reward.json``, whichever the script wrote; empty: neither (or timed out)."""
    reward_content: bytes
    rewards: dict[str, float]
    """Parsed from the reward file; empty when `reward_error` says why not."""
    reward_error: str
    pytest_report: str = ""
    """What pytest's own report said (its counts, or why the rewards were zeroed); empty: not judged."""
    leftover: str = ""
    """What the verify changed that could not be undone (a soft verify's fence), or why cleaning
    up after it failed; empty: nothing is left of it."""
    cleanup: list[str] = field(default_factory=list)
    """What the clean-up after the script did (a soft verify's fence), one line each."""
    graded: GradedReward | None = None
    """reward.json in BenchFlow's graded form (metrics and an aggregate), read; None otherwise."""

    def output_text(self) -> str:
        """Stdout followed by stderr, decoded as UTF-8 (invalid bytes replaced)."""
        return (self.stdout + self.stderr).decode("utf-8", errors="replace")
