"""The agent registry: declarations loaded from ``agents.yaml`` (data, not code).

An agent is a program installed in the sandbox and launched there with environment variables
that point it at the per-rollout LLM proxy. See ``agents.yaml`` for the built-in declarations.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from reroll.errors import AgentError


class AgentSpec(BaseModel):
    """One agent declaration."""

    model_config = ConfigDict(extra="forbid")
    name: str
    """Registry name, e.g. ``mini-swe-agent``."""
    description: str
    """One line shown by ``reroll agents``."""
    api_format: Literal["openai-chat", "none"]
    """The LLM API the agent speaks; ``none`` for agents that call no model (oracle)."""
    install: str | None = None
    """Shell script that installs the agent into ``$REROLL_AGENT_HOME``; run once, then cached."""
    launch: str
    """Shell command that runs the agent headless in the workspace until it finishes."""
    env: dict[str, str] = {}
    """Extra environment; values may use ``{base_url}``, ``{api_key}`` and ``{model}``."""
    needs_solution: bool = False
    """Upload the task's solution folder before launch (``$REROLL_SOLUTION_DIR``)."""

    @property
    def install_key(self) -> str:
        """Name of the install folder: the agent's name and a hash of its install script."""
        digest = hashlib.sha256((self.install or "").encode()).hexdigest()[:12]
        return f"{self.name}-{digest}"

    def launch_env(self, *, base_url: str, api_key: str, model: str) -> dict[str, str]:
        """The `env` values with their placeholders filled in."""
        values = {"base_url": base_url, "api_key": api_key, "model": model}
        return {key: value.format_map(values) for key, value in self.env.items()}


@cache
def registry() -> dict[str, AgentSpec]:
    """All built-in agents by name (loaded once from the packaged ``agents.yaml``)."""
    raw = yaml.safe_load(resources.files("reroll").joinpath("agents.yaml").read_text(encoding="utf-8"))
    return {name: AgentSpec(name=name, **fields) for name, fields in raw.items()}


def get_agent(name: str) -> AgentSpec:
    """The declaration of agent `name`.

    Raises:
        AgentError: no such agent; the message lists the known ones.
    """
    agents = registry()
    if name not in agents:
        raise AgentError(f"unknown agent {name!r}; known agents: {', '.join(sorted(agents))}")
    return agents[name]
