"""The agent registry: declarations loaded from ``agents.yaml`` (data, not code).

An agent is a program installed in the sandbox and launched there with environment variables
that point it at the per-rollout LLM proxy. See ``agents.yaml`` for the built-in declarations.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from reroll_contracts.errors import AgentError
from reroll_contracts.proxy import FormatName, VolatileRule
from reroll_contracts.yamltext import safe_load

SKILL_PATH_ROOTS = ("$HOME/", "$WORKSPACE/")
"""What an agent's ``skill_paths`` start with: its HOME or its workspace in the sandbox."""
UV_REQUIREMENT = "uv==0.13.9"
"""The uv an agent's `AgentSpec.pip` requirements are installed with (PyPI): it downloads and
unpacks in parallel, ~3x faster than pip here (aider-chat: 19 s against pip's ~2 min)."""
McpFormat = Literal["claude-code", "codex", "openhands"]
"""The native MCP configurations reroll writes for agents (`reroll.rollout.mcp` renders them)."""


class AgentSpec(BaseModel):
    """One agent declaration."""

    model_config = ConfigDict(extra="forbid")
    name: str
    """Registry name, e.g. ``mini-swe-agent``."""
    description: str
    """One line shown by ``reroll agents``."""
    api_format: FormatName | Literal["none"]
    """The LLM API the agent speaks (a `reroll_contracts.wire` name); ``none`` for agents that call
    no model (oracle)."""
    install: str | None = None
    """Shell script that installs the agent into ``$REROLL_AGENT_HOME``; run once, then cached.
    With `pip` it runs after the PyPI install (`install_script`)."""
    pip: list[str] = []
    """PyPI requirements (and ``uv pip install`` options such as ``--no-deps``) installed into the
    venv ``$REROLL_AGENT_HOME/venv``, made with `python` (required with it); see `install_script`."""
    python: str | None = None
    """A CPython version (``3.12``) the install script makes its venv with, given to it as
    ``$REROLL_PYTHON``: the host's (local sandbox), or a relocatable copy of the host's uploaded
    into the agents folder, else the sandbox's own ``python3.12`` if it has venv and ensurepip
    (see `reroll.installs.python_runtime`); so the install needs nothing of the task image's Python."""
    launch: str
    """Shell command that runs the agent headless in the workspace until it finishes."""
    resume: str | None = None
    """Shell command that sends the next prompt (``$REROLL_PROMPT_FILE``) to the agent's previous
    session in the workspace (a trial's ``resume: true`` turn, multi-turn), run like `launch`;
    None: the agent has no session to resume, and such a turn is refused."""
    session_paths: list[str] = []
    """Where the agent keeps its native session (files and folders relative to its HOME, e.g.
    ``.claude``): a checkpoint's session layer copies them, and a branch forked from the
    checkpoint runs `resume` on them (`reroll.rollout.layers`). Empty: the agent cannot be forked,
    its branches replay the prefix."""
    process_checkpoint: bool = False
    """Its conversation lives in its process's memory and its process tree can be checkpointed
    with CRIU (`reroll.rollout.process_layer`): ``reroll branch --via snapshot`` on the isolated
    ``local`` sandbox dumps the tree at the cut and restores it in each child (its HTTP client
    must send a request again when its connection drops, as the OpenAI SDK does). Declared for
    an agent that was tried so; False: such an agent's branches replay."""
    env: dict[str, str] = {}
    """Extra environment; values may use ``{base_url}`` (the LLM proxy, OpenAI-style, ending in
    ``/v1``), ``{proxy_url}`` (the same without ``/v1``, for clients that add it themselves, such
    as Anthropic's), ``{api_key}`` (the per-rollout proxy token) and ``{model}``."""
    skill_paths: list[str] = []
    """Where the agent discovers skills natively (``$HOME/.claude/skills``): each a path starting
    with ``$HOME/`` or ``$WORKSPACE/``, where `reroll.rollout.skills.mount_skills` links the
    mounted skills folder. Empty: the agent reads no skills natively, and they are named in its
    prompt instead (as the ``description`` nudge does, `reroll.tasks.skills.with_nudge`)."""
    needs_solution: bool = False
    """Upload the task's solution folder before launch (``$REROLL_SOLUTION_DIR``)."""
    proxy_mode: Literal["base_url", "intercept"] = "base_url"
    """How the agent reaches the LLM proxy: ``base_url`` (its base-URL variables, from `env`), or
    ``intercept`` for agents with the provider's URL hard-coded: ``HTTPS_PROXY`` to a mitmproxy
    front end and its CA trusted in the sandbox (see `reroll.host.intercept`)."""
    mcp: McpFormat | None = None
    """The MCP configuration the agent reads (``claude-code``: a ``--mcp-config`` JSON file;
    ``codex``: ``[mcp_servers]`` tables of its config.toml; ``openhands``: its ``mcp.json``):
    `reroll.rollout.mcp` writes the task's MCP servers in it and names the file in
    ``$REROLL_MCP_CONFIG``, which `launch` and `resume` pass on. None: the agent has no MCP
    client, and a task with MCP servers that are not optional refuses it."""
    volatile: list[VolatileRule] = []
    """The parts of the agent's requests that legitimately differ from run to run, so a replay
    does not count them as divergences: each rule is one of ``path`` (a dotted JSON path into
    the request body, ``*`` for every key or element, e.g. ``client_metadata.session_id``),
    ``pattern`` (a regular expression matched inside every string, e.g. a datetime or
    ``Chunk ID: \\w+``) or ``value`` (a literal string), with an optional ``label``; see
    `reroll_proxy.volatile`. The sandbox's paths (workspace, HOME) are volatile for every agent."""
    volatile_files: list[str] = []
    """Workspace files whose bytes legitimately differ between a run and its replay although
    the agent did the same (``fnmatch`` patterns of paths relative to the workspace, e.g.
    ``.git/index``, which holds file times and inode numbers): ``reroll replay`` compares
    their presence, not their hashes."""

    @field_validator("skill_paths")
    @classmethod
    def _rooted_skill_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith(SKILL_PATH_ROOTS) or ".." in path.split("/"):
                raise ValueError(f"skill path {path!r} must start with $HOME/ or $WORKSPACE/, without ..")
        return paths

    @model_validator(mode="after")
    def _pip_needs_python(self) -> AgentSpec:
        if self.pip and self.python is None:
            raise ValueError("pip requirements need a python version to make their venv with")
        return self

    @property
    def install_script(self) -> str | None:
        """The shell script run once per install key (`install_key`): for `pip`, a venv made with
        ``$REROLL_PYTHON``, `UV_REQUIREMENT` in it with pip, then the requirements with uv (in
        parallel, byte code compiled now: the agent's user cannot write ``__pycache__`` into
        the shared installs); then `install`. None: nothing to install."""
        if not self.pip:
            return self.install
        venv = "$REROLL_AGENT_HOME/venv"
        lines = [
            f'"$REROLL_PYTHON" -m venv "{venv}"',
            f'"{venv}/bin/pip" install --quiet --disable-pip-version-check {UV_REQUIREMENT}',
            f'"{venv}/bin/uv" pip install --quiet --no-cache --native-tls --compile-bytecode'
            f' --python "{venv}/bin/python" {shlex.join(self.pip)}',
        ]
        return "\n".join([*lines, self.install or ""]).rstrip("\n")

    @property
    def forkable(self) -> bool:
        """A checkpoint can capture its session and a branch resume it: it declares `resume`
        and `session_paths`."""
        return self.resume is not None and bool(self.session_paths)

    @property
    def install_key(self) -> str:
        """Name of the install folder: the agent's name and a hash of its install script (and
        of the Python version it needs)."""
        digest = hashlib.sha256(f"{self.install_script or ''}{self.python or ''}".encode()).hexdigest()[:12]
        return f"{self.name}-{digest}"

    def launch_env(self, *, base_url: str, api_key: str, model: str) -> dict[str, str]:
        """The `env` values with their placeholders filled in (`base_url` ends in ``/v1``)."""
        values = {"base_url": base_url, "proxy_url": base_url.removesuffix("/v1")}
        values |= {"api_key": api_key, "model": model}
        return {key: value.format_map(values) for key, value in self.env.items()}


AGENTS_FILE_ENV = "REROLL_AGENTS_FILE"
"""Environment variable naming a YAML file of more agent declarations (same shape as ``agents.yaml``)."""


@cache
def registry() -> dict[str, AgentSpec]:
    """All agents by name: the packaged ``agents.yaml``, then ``$REROLL_AGENTS_FILE`` (loaded once).

    Raises:
        AgentError: ``$REROLL_AGENTS_FILE`` is missing or holds an invalid declaration (named).
    """
    packaged = resources.files("reroll").joinpath("agents.yaml").read_text(encoding="utf-8")
    agents = _declarations(packaged, "agents.yaml")
    if extra := os.environ.get(AGENTS_FILE_ENV):
        try:
            text = Path(extra).read_text(encoding="utf-8")
        except OSError as exc:
            raise AgentError(f"{AGENTS_FILE_ENV}={extra}: {exc}") from exc
        agents |= _declarations(text, extra)
    return agents


def _declarations(text: str, source: str) -> dict[str, AgentSpec]:
    try:
        raw = safe_load(text) or {}
        if not isinstance(raw, dict):
            raise AgentError(f"{source}: expected a mapping of agent names to declarations")
        return {name: AgentSpec(name=name, **fields) for name, fields in raw.items()}
    except (yaml.YAMLError, ValidationError, TypeError) as exc:
        raise AgentError(f"{source}: invalid agent declaration: {exc}") from exc


def get_agent(name: str) -> AgentSpec:
    """The declaration of agent `name`.

    Raises:
        AgentError: no such agent; the message lists the known ones and how to declare another.
    """
    agents = registry()
    if name not in agents:
        raise AgentError(
            f"unknown agent {name!r}; known agents: {', '.join(sorted(agents))} "
            f"(declare another in a YAML file shaped like reroll's agents.yaml, named by ${AGENTS_FILE_ENV})"
        )
    return agents[name]
