"""Why a test script could not run its tests: a tool it needs is missing, or it tried to reach the
internet from a sandbox that has none.

A test script often installs what it runs while it runs (``uvx pytest``, ``pip install pytest``,
``curl … | sh`` for uv). When that fails, most scripts still write a reward of 0, and that 0 is
not the agent's: `diagnose` reads the script's output for the evidence (the shell's
``not found`` for a known tool; the resolver's or the downloader's error naming a host) so the
rollout ends as a verifier error, naming the command or the host, never as ``ok 0.0``. The
patterns are the messages of dash and bash, curl, wget, pip (urllib3), uv and apt, as they print
them; a command the agent was meant to write (anything not in `TOOLS`) is the agent's failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

TOOLS = frozenset(
    {
        "apt-get",
        "bash",
        "curl",
        "git",
        "node",
        "npm",
        "npx",
        "pip",
        "pip3",
        "pytest",
        "python",
        "python3",
        "uv",
        "uvx",
        "wget",
    }
)
"""Programs a test script takes from its image or installs itself: missing, the verifier cannot run."""
NOT_FOUND = re.compile(r"(?:^|[\s:])([\w.+/-]+): (?:command )?not found\b", re.MULTILINE)
"""dash's ``test.sh: 5: uvx: not found`` and bash's ``test.sh: line 5: uvx: command not found``."""
HOST_PATTERNS = (
    re.compile(r"Could not resolve host: ([\w.-]+)"),  # curl
    re.compile(r"Temporary failure resolving '([\w.-]+)'"),  # apt
    re.compile(r"unable to resolve host address ['\u2018]([\w.-]+)['\u2019]"),  # wget
    re.compile(r"host='([\w.-]+)'.*(?:NameResolutionError|Failed to establish a new connection)"),  # pip
    re.compile(r"(?:Failed to fetch|error sending request for url)[:\s(`]+https?://([\w.-]+)"),  # uv
    re.compile(r"Failed to download .*https?://([\w.-]+)"),  # uv (Python downloads)
)
"""Messages that name the host a download could not reach."""
OFFLINE = re.compile(
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable"
    r"|getaddrinfo failed|dns error|No address associated with hostname"
)
"""Messages of a failed lookup or an unreachable network that name no host."""


@dataclass(frozen=True)
class Diagnosis:
    """Why the test script could not run its tests."""

    kind: Literal["offline", "missing_command"]
    """``offline``: it tried to reach the internet and could not; ``missing_command``: a tool is missing."""
    what: str
    """The host it tried to reach (empty when the output names none), or the missing command."""

    def message(self) -> str:
        """One sentence for result.json's ``error``."""
        if self.kind == "offline":
            target = f" ({self.what})" if self.what else ""
            return (
                f"the verifier could not run: its test script tried to reach the internet{target} and "
                "the sandbox has no route there, so its reward is not the agent's (run where the "
                "task's network is reachable, or bake what it downloads into the task's image)"
            )
        return (
            f"the verifier could not run: its test script needs `{self.what}`, which the sandbox does "
            "not have, so its reward is not the agent's"
        )


def diagnose(output: str) -> Diagnosis | None:
    """The reason in `output` (the script's stdout and stderr) that it could not run its tests:
    a failed download first (a missing tool is often its consequence), then a missing tool;
    None when the output shows neither."""
    for pattern in HOST_PATTERNS:
        if match := pattern.search(output):
            return Diagnosis("offline", match.group(1))
    if OFFLINE.search(output):
        return Diagnosis("offline", "")
    for match in NOT_FOUND.finditer(output):
        command = match.group(1).rpartition("/")[2]
        if command in TOOLS:
            return Diagnosis("missing_command", command)
    return None
