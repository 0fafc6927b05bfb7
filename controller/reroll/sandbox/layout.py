"""Where things live inside a sandbox (`SandboxLayout`), and the hostname every sandbox has.

Every backend makes a layout (and may settle parts of it when it starts: the image's WORKDIR,
user and ENV); the sandbox's operations (`reroll.sandbox.sidecar_client.SidecarClient`) and the
planes above read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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
    network_env: Mapping[str, str] = field(default_factory=dict)
    """What every process needs to use the sandbox's network: the proxy variables of a `local`
    allow-list (`reroll.sandbox.local.netns.proxy_env`); empty elsewhere."""

    def path(self, relative: str) -> str:
        """A path under the sandbox root, e.g. ``path("verifier")`` → ``/verifier``."""
        return str(Path(self.root) / relative.lstrip("/"))

    def env(self) -> dict[str, str]:
        """Environment variables every process in the sandbox gets."""
        return {
            **self.network_env,
            "HOME": self.home,
            "REROLL_SANDBOX_ROOT": self.root,
            "REROLL_WORKSPACE": self.workspace,
            "REROLL_LOGS_DIR": self.logs_dir,
        }
