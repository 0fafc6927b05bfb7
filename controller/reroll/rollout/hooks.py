"""The hook protocol of a rollout's features, and their registry (mitmproxy's addons, in spirit).

A feature that runs around a rollout — skills, the learner store, services and MCP, checkpoints,
interception, ask_user, the judges, a persona User — is one module of `reroll.rollout.extensions`
holding one `Extension`: it reads its own options, and overrides the hooks it needs; every hook is
a no-op by default. `EXTENSIONS` names them (name → ``module:Class``), imported only when a
rollout starts (`load_extensions`), in that order: every hook is called on each extension in
registry order. Adding a feature is its own file and one line here.

The hooks, in the order a rollout calls them (`reroll.rollout.start.start_rollout`, then
`reroll.rollout.lifecycle.execute_rollout`):

1. `Extension.configure` — before anything is written: refuse what cannot run (raise), and
   update the `Draft` (config.json, the trial, the task, the proxy's holds).
2. `Extension.before_sandbox_start` — the sandbox is created, the LLM proxy started; the
   sandbox is not started yet (a host port may still be opened to it).
3. `Extension.after_sandbox_start` — the sandbox is started and the agents installed; the
   environment may be extended (``Run.env``, ``Run.task_env``).
4. `Extension.before_agent` — the verifier is prepared, the trial about to run (``Run.trial``
   may be given a scene hook, an answerer, a persona plan; ``Run.agent_env`` extended).
5. `Extension.before_turn` — before each agent launch (``TurnLaunch``: its environment, MCP
   servers, whether it resumes a session).
6. `Extension.at_checkpoint` / `Extension.at_restore` — a checkpoint was captured (during the
   agent phase) or restored (before the agent).
7. `Extension.after_agent` — the trial ended (the proxy still running).
8. `Extension.before_verify` — the proxy stopped, the agent's processes are gone and the
   workspace's manifest written: the state is final. Called whether or not a verify follows.
9. `Extension.after_verify` — the verifier gave its verdict (not called when none was asked).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reroll_contracts.errors import ConfigError
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.runfolder.run import RunConfig, RunResult
from reroll.settings import RolloutSettings
from reroll.tasks.task import Task
from reroll.trials.config import TrialConfig

if TYPE_CHECKING:
    from reroll.host.llm_proxy import LlmProxy
    from reroll.rollout.origin import Origin
    from reroll.rollout.plan import RolloutPlan
    from reroll.rollout.turns.scenes import AgentOutcome, TrialContext
    from reroll.rollout.verify.verifiers import Verdict, Verifier
    from reroll.sandbox.base import Sandbox
    from reroll.sandbox.results import ExecResult

EXTENSIONS: dict[str, str] = {
    "skills": "reroll.rollout.extensions.skills:Skills",
    "learner_store": "reroll.rollout.extensions.learner_store:LearnerStore",
    "ask_user": "reroll.rollout.extensions.ask_user:AskUser",
    "services": "reroll.rollout.extensions.services:ServicesAndMcp",
    "checkpoints": "reroll.rollout.extensions.checkpoints:Checkpoints",
    "interception": "reroll.rollout.extensions.interception:Interception",
    "judges": "reroll.rollout.extensions.judges:Judges",
    "persona": "reroll.rollout.extensions.persona:Persona",
}
"""The rollout's extensions, name → ``module:Class`` (imported lazily), in the order their hooks run."""


@dataclass
class Draft:
    """A rollout being planned (`Extension.configure`): what `reroll.rollout.start.start_rollout`
    resolved so far, which an extension may update before the run folder is created."""

    origin: Origin
    """Where the rollout starts: a new recording, or a checkpoint of a recorded run."""
    given: RolloutSettings
    """The settings the caller gave (`reroll.settings`)."""
    settings: RolloutSettings
    """How the rollout runs: `given`, and from a checkpoint the original's recorded settings where
    `given` leaves a field out (`reroll.settings.continuation_settings`); each extension reads its
    own fields."""
    task: Task
    """The task as the sandbox gets it (the run's network applied)."""
    trial: TrialConfig
    """The trial, resolved."""
    agents: dict[str, AgentSpec]
    """The trial's agents by name (the first role's first)."""
    config: RunConfig
    """config.json as it will be written."""
    hold_every: int = 0
    """The proxy holds the request of every this many steps until an extension releases it
    (`reroll.host.llm_proxy.LlmProxy.wait_for_held`); 0: never."""
    proxy_token: str | None = None
    """The token the proxy takes for the agent's (a process restored from another rollout
    presents that rollout's: `reroll.rollout.process_layer`); None: a fresh one."""


@dataclass
class TurnLaunch:
    """One launch of an agent (`Extension.before_turn`): what it is started with."""

    agent: AgentSpec
    env: dict[str, str]
    """The environment the launch adds to (its own variables come on top)."""
    resume: bool
    """Run the agent's ``resume`` command (a later turn of the same session)."""
    mcp_servers: list[Any] = field(default_factory=list)
    """MCP servers offered besides the task's (`reroll.tasks.environment.McpServerSpec`)."""
    notes: list[str] = field(default_factory=list)
    """Paragraphs told after the prompt (a new session only): how an agent without an MCP client
    reaches the MCP tools (`reroll.rollout.extensions.services`)."""
    restored: Callable[[Callable[[str, bytes], None], float], Coroutine[Any, Any, ExecResult]] | None = None
    """Run instead of launching the agent, given the output callback and the timeout in seconds:
    a restored process tree waited for (`reroll.rollout.process_layer.run_restored`)."""


@dataclass
class Run:
    """A running rollout, as its extensions see it (`reroll.rollout.lifecycle.execute_rollout`)."""

    plan: RolloutPlan
    console: Console
    stack: contextlib.AsyncExitStack
    """Closed when the rollout ends, whatever happens: push cleanups here (last pushed, first run)."""
    sandbox: Sandbox
    result: RunResult
    """result.json as it will be written."""
    hooks: Hooks
    """Every extension of the rollout (to call `Hooks.at_checkpoint`, `Hooks.at_restore`)."""
    proxy: LlmProxy | None = None
    """The LLM proxy; None for an agent that calls no model."""
    env: dict[str, str] = field(default_factory=dict)
    """The base environment of the controller's processes in the sandbox."""
    task_env: dict[str, str] = field(default_factory=dict)
    """What the task's processes (agent, verifier) get on top of `env`."""
    agent_env: dict[str, str] = field(default_factory=dict)
    """What the agent's processes get on top of ``env | task_env``."""
    verifier: Verifier | None = None
    trial: TrialContext | None = None
    """What the turn scheduler gets (set before `Extension.before_agent`)."""
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once an agent of the trial is launched (`reroll.rollout.agent_phase.run_agent`): the
    rollout then lets go of its job's start gate."""


class Extension:
    """One feature of a rollout: every hook a no-op (see the module docstring for when each runs)."""

    def configure(self, draft: Draft) -> None:
        """Check and record this feature's options before anything is written. A command that
        starts many rollouts (``reroll branch``, ``reroll job``) also calls it on a draft of its
        first rollout, through `reroll.rollout.start.check_rollout`, before it writes anything: it
        must write nothing and start nothing.

        Raises:
            RerollError: a subclass (``ConfigError``'s mostly) naming what cannot run; nothing is
            written then.
        """

    async def before_sandbox_start(self, run: Run) -> None:
        """The sandbox is created, the proxy started, the sandbox not yet started."""

    async def after_sandbox_start(self, run: Run) -> None:
        """The sandbox is started, the agents installed."""

    async def before_agent(self, run: Run) -> None:
        """The verifier is prepared; the trial is about to run."""

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        """An agent is about to be launched."""

    async def at_checkpoint(self, run: Run, step: int, folder: Path) -> None:
        """The checkpoint of `step` was captured into `folder`."""

    async def at_restore(self, run: Run, step: int, folder: Path) -> None:
        """The checkpoint of `step` in `folder` was restored into the sandbox."""

    async def after_agent(self, run: Run, outcome: AgentOutcome) -> None:
        """The trial ended with `outcome` (the proxy still runs)."""

    async def before_verify(self, run: Run, outcome: AgentOutcome) -> None:
        """The workspace is final (the agent's processes gone, the proxy stopped)."""

    async def after_verify(self, run: Run, verdict: Verdict) -> None:
        """The verifier gave `verdict`."""


@dataclass
class Hooks:
    """The extensions of one rollout, each hook called on all of them in registry order."""

    extensions: list[Extension] = field(default_factory=list)

    def configure(self, draft: Draft) -> None:
        """`Extension.configure` of each extension."""
        for extension in self.extensions:
            extension.configure(draft)

    async def before_sandbox_start(self, run: Run) -> None:
        """`Extension.before_sandbox_start` of each extension."""
        for extension in self.extensions:
            await extension.before_sandbox_start(run)

    async def after_sandbox_start(self, run: Run) -> None:
        """`Extension.after_sandbox_start` of each extension."""
        for extension in self.extensions:
            await extension.after_sandbox_start(run)

    async def before_agent(self, run: Run) -> None:
        """`Extension.before_agent` of each extension."""
        for extension in self.extensions:
            await extension.before_agent(run)

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        """`Extension.before_turn` of each extension."""
        for extension in self.extensions:
            await extension.before_turn(run, launch)

    async def at_checkpoint(self, run: Run, step: int, folder: Path) -> None:
        """`Extension.at_checkpoint` of each extension."""
        for extension in self.extensions:
            await extension.at_checkpoint(run, step, folder)

    async def at_restore(self, run: Run, step: int, folder: Path) -> None:
        """`Extension.at_restore` of each extension."""
        for extension in self.extensions:
            await extension.at_restore(run, step, folder)

    async def after_agent(self, run: Run, outcome: AgentOutcome) -> None:
        """`Extension.after_agent` of each extension."""
        for extension in self.extensions:
            await extension.after_agent(run, outcome)

    async def before_verify(self, run: Run, outcome: AgentOutcome) -> None:
        """`Extension.before_verify` of each extension."""
        for extension in self.extensions:
            await extension.before_verify(run, outcome)

    async def after_verify(self, run: Run, verdict: Verdict) -> None:
        """`Extension.after_verify` of each extension."""
        for extension in self.extensions:
            await extension.after_verify(run, verdict)


def load_extensions(registry: dict[str, str] | None = None) -> Hooks:
    """A fresh instance of every extension of `registry` (one rollout's), in its order.

    Args:
        registry: name → ``module:Class`` [default: `EXTENSIONS`].

    Raises:
        ConfigError: a module cannot be imported, lacks the class, or the class is no `Extension`.
    """
    loaded: list[Extension] = []
    for name, dotted in (EXTENSIONS if registry is None else registry).items():
        module_name, _, class_name = dotted.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"rollout extension {name} ({dotted}) cannot be loaded: {exc}") from exc
        if not (isinstance(found, type) and issubclass(found, Extension)):
            raise ConfigError(f"rollout extension {name} ({dotted}) is not a reroll.rollout.hooks.Extension")
        loaded.append(found())
    return Hooks(loaded)
