"""`RolloutPlan`: everything one rollout needs, built by `reroll.rollout.start.start_rollout` and run
by `reroll.rollout.lifecycle.execute_rollout` (a module of its own, so that the lifecycle's phases
import it without importing the lifecycle). What a feature needs is its extension's own
(`reroll.rollout.hooks`), not the plan's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel
from reroll_contracts.proxy import ReplayConfig, VolatileRule

from reroll.agents import AgentSpec
from reroll.models.spec import ModelSpec, model_name, parse_model
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import RunConfig
from reroll.runfolder.trial import TurnRecord
from reroll.settings import RolloutSettings
from reroll.tasks.task import Task
from reroll.trials.config import TrialConfig


@dataclass(frozen=True)
class RolloutPlan:
    """Everything one rollout needs (built by `reroll.rollout.start.start_rollout`).

    `config` says what runs — model, agent timeout, sandbox backend, network, faults,
    provenance — and is written to config.json as it is; the other fields are what the
    controller loaded for it. The properties below read `config`, so nothing is said twice.
    """

    task: Task
    """The task, with ``config.network`` applied."""
    agents: dict[str, AgentSpec]
    """The agents of ``trial``'s roles, by name (the first role's first)."""
    trial: TrialConfig
    """The scenes, roles and turns, resolved (`reroll.trials.config`); a plain run is `TrialConfig.single`."""
    run_dir: Path
    config: RunConfig
    replay: ReplayConfig | None = None
    """What the proxy replays before it goes live; None for a fresh recording."""
    recorded_values: tuple[VolatileRule, ...] = ()
    """When it replays: the recorded rollout's sandbox values (workspace, HOME...:
    `reroll.host.llm_proxy.recorded_sandbox_values`), volatile next to the new sandbox's own."""
    recorded: list[TurnRecord] = field(default_factory=list)
    """For a continuation: the original's turns up to the cut, whose prompts are sent again as
    recorded (`reroll.rollout.turns.scenes`)."""
    hold_every: int = 0
    """The proxy holds the request of every this many steps until an extension releases it
    (`reroll.host.llm_proxy.LlmProxy.wait_for_held`: the checkpoints'); 0: never."""
    proxy_token: str | None = None
    """The token the proxy takes for the agent's (`reroll.rollout.hooks.Draft.proxy_token`)."""
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    """How the rollout runs (`reroll.settings`), of which `config` is the recorded form."""
    sandbox_settings: BaseModel | None = None
    """The backend's settings the sandbox is made with, an instance of its config model
    (`reroll.sandbox.base.Backend`): ``settings.sandbox_config``, and for a branch started from a
    kept pool its ``from_snapshot`` (`reroll.rollout.origin.FromCheckpoint.pool`), which is for this
    run only and never recorded; None: the backend's defaults."""

    @property
    def paths(self) -> RunPaths:
        """The paths of `run_dir`, the run folder (`reroll.runfolder.paths.RunPaths`)."""
        return RunPaths(self.run_dir)

    @property
    def agent(self) -> AgentSpec:
        """The first role's agent: its API format and proxy mode are the rollout's."""
        return next(iter(self.agents.values()))

    @property
    def timeout_seconds(self) -> float:
        """The agent's wall-clock budget in seconds: ``config.timeout_sec``, else the task's."""
        return self.config.timeout_sec or self.task.spec.agent.timeout_sec

    @property
    def live_model(self) -> ModelSpec | None:
        """``config.model`` parsed: the live upstream; None for an agent that calls no model and
        for a replay-only continuation.

        Raises:
            ModelError: the model cannot be resolved (see `reroll.models.spec.parse_model`).
        """
        provenance = self.config.continued_from
        if self.agent.api_format == "none" or self.config.model is None:
            return None
        if provenance is not None and provenance.replay_only:
            return None
        return parse_model(self.config.model, self.task.path, self.agent.name)

    @property
    def agent_model(self) -> str:
        """The model name the agent asks for: a continuation keeps the original's (the proxy
        sends the live model's name upstream); "" for an agent that calls none."""
        provenance = self.config.continued_from or self.config.branched_from
        spec = provenance.original_model if provenance is not None else self.config.model
        return model_name(spec) if spec else ""
