"""What the `Sandbox` protocol's methods return: plain values, whatever the backend."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ExecResult:
    """The outcome of `Sandbox.exec`."""

    exit_code: int
    """The exit code, or the negative signal number when killed by a signal (-9 after a timeout)."""
    stdout: bytes
    stderr: bytes
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
    stderr: bytes
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

    def output_text(self) -> str:
        """Stdout followed by stderr, decoded as UTF-8 (invalid bytes replaced)."""
        return (self.stdout + self.stderr).decode("utf-8", errors="replace")
