"""The one path of every new rollout: `start_rollout`.

Every rollout reroll starts — a recording (`reroll.rollout.commands.record.run_task`), a
continuation (`reroll.rollout.commands.continue_.continue_run`), a replay check
(`reroll.rollout.commands.replay.replay_run`) and each branch (`reroll.jobs.branch`) — goes
through `start_rollout`: from an origin (a `NewRecording`, or a
`reroll.rollout.checkpoint.Checkpoint` of a recorded run) it creates the new run folder, writes the one
`RunConfig` (with its provenance), and executes the `RolloutPlan` (`reroll.rollout.lifecycle`). The callers
differ only in how they pick the origin, the live model and the provenance. Every feature around the
rollout (skills, learner store, services and MCP, checkpoints, interception, ask_user, judges, a
persona) is an extension (`reroll.rollout.hooks`), none imported here.
"""

from __future__ import annotations

__all__ = [
    "RESUME_PROMPT",
    "FromCheckpoint",
    "NewRecording",
    "Origin",
    "RolloutOutcome",
    "check_rollout",
    "load_runnable_task",
    "model_for",
    "start_rollout",
]

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from reroll_contracts.errors import TaskError
from reroll_contracts.network import NetworkPolicy, PhaseNetworks
from reroll_contracts.proxy import ReplayConfig
from rich.console import Console

from reroll import __version__
from reroll.agents import AgentSpec, get_agent
from reroll.host.llm_proxy import recorded_sandbox_values
from reroll.models.spec import ModelSpec, parse_model
from reroll.rollout.hooks import Draft, Hooks, load_extensions
from reroll.rollout.lifecycle import execute_rollout, fitted_to_host
from reroll.rollout.origin import RESUME_PROMPT, FromCheckpoint, NewRecording, Origin
from reroll.rollout.plan import RolloutPlan
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.rollout.trust import refuse_untrusted
from reroll.rollout.turns.scenes import check_trial
from reroll.rollout.verify.verifiers import verifier_for
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import (
    BranchedFrom,
    RescoredFrom,
    RunConfig,
    RunResult,
    create_run_folder,
    now_iso,
)
from reroll.sandbox.base import WITHOUT_NETWORK_POLICY, load_backend
from reroll.sandbox.spec import SandboxSpec
from reroll.settings import (
    DEFAULT_SANDBOX,
    RolloutSettings,
    continuation_settings,
    over_settings,
    recorded_settings,
    recording_settings,
)
from reroll.tasks.task import Task, load_task
from reroll.tasks.variants import with_environment, with_network
from reroll.trials.config import TrialConfig


@dataclass(frozen=True)
class RolloutOutcome:
    """A finished rollout: where its folder is and what result.json says."""

    run_dir: Path
    result: RunResult


async def start_rollout(
    origin: Origin,
    *,
    live_model: ModelSpec | None,
    parent: Path,
    name: str,
    options: RolloutSettings,
    console: Console | None = None,
    start_gate: asyncio.Semaphore | None = None,
    rescored_from: RescoredFrom | None = None,
) -> RolloutOutcome:
    """Create the run folder ``parent/name``, write its config, and run the rollout with every
    extension of `reroll.rollout.hooks.EXTENSIONS`.

    Args:
        origin: a `NewRecording`, or `FromCheckpoint`: the checkpoint's first ``cut_index``
            exchanges are replayed before `live_model` takes over.
        live_model: the live model, None when none goes live (an agent that calls none, or a
            replay-only continuation: then the provenance says ``replay_only``).
        parent: the folder the run folder goes in (created if missing).
        name: the run folder's name; ``name-2``, ``name-3`` … when it is taken.
        options: how the rollout runs; from a checkpoint, the original's recorded settings fill in
            what it leaves out (`reroll.settings.continuation_settings`).
        console: where progress goes [default: ``harness/controller.log`` in the run folder].
        start_gate: held while the model server, LLM proxy and sandbox start (see
            `reroll.rollout.lifecycle.execute_rollout`); None: no bound.
        rescored_from: config.json's ``rescored_from`` (``reroll rescore``), or None.

    Returns:
        The new run folder and its result.

    Raises:
        SandboxBackendError: the sandbox backend is unknown, missing or refuses its settings.
        TaskError: network ``none`` on a sandbox without a network policy; an unknown
            ``verifier.type`` or one refusing its ``verifier.options``.
        AgentError, TrialError: a role's agent is unknown; the trial is inconsistent.
        RerollError: what an extension's `reroll.rollout.hooks.Extension.configure` raises
            (skills, learner store, ask_user, MCP servers, judge and User models).
        Nothing is written when any of these is raised.
    """
    draft, hooks = _configured(origin, live_model, options, rescored_from)
    run_dir = create_run_folder(parent, name)
    plan = RolloutPlan(
        task=draft.task,
        agents=draft.agents,
        trial=draft.trial,
        run_dir=run_dir,
        config=draft.config,
        settings=draft.settings,
        hold_every=draft.hold_every,
        proxy_token=draft.proxy_token,
        sandbox_settings=_sandbox_settings(origin, draft.config.sandbox, draft.settings),
        **_replayed(origin, draft.settings, run_dir),
    )
    with _progress(console, run_dir) as progress:
        progress.print(f"run folder: {run_dir}")
        return RolloutOutcome(run_dir, await execute_rollout(plan, progress, start_gate, hooks))


def check_rollout(
    origin: Origin,
    *,
    live_model: ModelSpec | None,
    options: RolloutSettings,
    rescored_from: RescoredFrom | None = None,
) -> None:
    """Refuse what `start_rollout` of the same arguments would refuse before writing anything
    (its checks and every extension's `reroll.rollout.hooks.Extension.configure`: the judge's and
    User's models, the MCP servers, skills, the learner store …), writing nothing. A command that
    starts many rollouts (``reroll branch``) calls it once before its first folder is written.

    Raises:
        As `start_rollout`.
    """
    _configured(origin, live_model, options, rescored_from)


def sandbox_of(
    origin: Origin, *, live_model: ModelSpec | None, options: RolloutSettings
) -> tuple[str, SandboxSpec, BaseModel | None]:
    """The backend, spec and settings that `start_rollout` of the same arguments makes its sandbox
    with (for a command that starts it ahead, `reroll.sandbox.ahead`), writing nothing.

    Raises:
        As `check_rollout`.
    """
    draft, _ = _configured(origin, live_model, options, None)
    backend = draft.config.sandbox
    spec = sandbox_spec(fitted_to_host(draft.task, backend)[0])
    return backend, spec, _sandbox_settings(origin, backend, draft.settings)


def _configured(
    origin: Origin, live_model: ModelSpec | None, options: RolloutSettings, rescored_from: RescoredFrom | None
) -> tuple[Draft, Hooks]:
    """The rollout's draft, configured by every extension (`reroll.rollout.hooks.Hooks.configure`),
    and the extensions."""
    draft = _draft(origin, live_model, options, rescored_from)
    hooks = load_extensions()
    hooks.configure(draft)
    return draft, hooks


def _draft(
    origin: Origin, live_model: ModelSpec | None, given: RolloutSettings, rescored_from: RescoredFrom | None
) -> Draft:
    """The rollout as the core resolves it, before its extensions configure it: the settings (from a
    checkpoint, derived from the original's), config.json (the backend's settings validated), the
    task with the run's network, the trial and its agents.

    Raises:
        SandboxBackendError, TaskError, AgentError, TrialError: see `start_rollout`.
    """
    if isinstance(origin, FromCheckpoint):
        original = origin.checkpoint.original
        refuse_untrusted(original.config, original.path, given.trust)  # before anything is imported
        settings = continuation_settings(recorded_settings(original.config), given)
    else:
        settings = recording_settings(given, origin.trial)
    backend = load_backend(settings.sandbox or DEFAULT_SANDBOX)
    settings = settings.model_copy(update={"sandbox_config": backend.typed(settings.sandbox_config)})
    config = _run_config(origin, live_model, settings).model_copy(update={"rescored_from": rescored_from})
    if isinstance(origin, NewRecording):
        task, agent = origin.task, origin.agent
    else:
        task, agent = origin.checkpoint.task, origin.checkpoint.agent
    trial = (config.trial or TrialConfig.single()).resolved(agent.name, config.model)
    agents = {agent.name: agent} | {name: get_agent(name) for name in trial.agents if name != agent.name}
    check_trial(trial, agents)
    verifier_for(task)  # an unknown verifier.type is refused before anything is written
    manifest = Path(config.environment_manifest) if config.environment_manifest else None
    services = tuple(config.environment_services) if config.environment_services else None
    task = with_network(with_environment(task, manifest, services), config.network)
    networks = task.spec.networks()
    if "none" in (networks.agent, networks.verifier) and config.sandbox in WITHOUT_NETWORK_POLICY:
        raise TaskError(
            f"{_network_source(config.network, networks)} needs --sandbox local or docker: "
            f"the {config.sandbox} sandbox has the host's network"
        )
    config = config.model_copy(update={"network_phases": networks})
    return Draft(origin, given, settings, task, trial, agents, config)


def _network_source(override: NetworkPolicy | None, networks: PhaseNetworks) -> str:
    """Who asked for network none: ``--network none``, else the task, for which phases."""
    if override == "none":
        return "--network none"
    phases = [name for name in ("agent", "verifier") if getattr(networks, name) == "none"]
    return f"the task's network none ({' and '.join(phases)})"


def _sandbox_settings(origin: Origin, backend: str, settings: RolloutSettings) -> BaseModel | None:
    """The backend settings `backend`'s sandbox is made with: the rollout's (``sandbox_config``),
    and for a branch from a kept pool (`FromCheckpoint.pool`) its ``from_snapshot``, for this run
    only (never recorded).

    Raises:
        SandboxBackendError: `backend` takes no ``from_snapshot`` (only ``local`` and ``docker`` keep pools).
    """
    if not (isinstance(origin, FromCheckpoint) and origin.pool):
        return settings.sandbox_config
    pool = load_backend(backend).settings({"from_snapshot": origin.pool})
    return over_settings(settings.sandbox_config, pool)


def _replayed(origin: Origin, settings: RolloutSettings, run_dir: Path) -> dict[str, Any]:
    """The `RolloutPlan` fields of a rollout that replays its origin's prefix (a checkpoint
    without layers): the proxy's replay, the recorded sandbox values, the recorded turns; of one
    forked from the layers of an earlier step (`FromCheckpoint.layers_step`): the proxy's replay
    of the remainder, from that step to the cut (written to `REMAINDER_FILE` in ``harness/``)."""
    if not isinstance(origin, FromCheckpoint):
        return {}
    checkpoint = origin.checkpoint
    if origin.layers is not None:
        start = origin.layers_step
        if start is None or start >= checkpoint.cut_index:
            return {}
        paths = RunPaths(run_dir)
        paths.make_harness()
        remainder = paths.replayed_remainder
        exchanges = checkpoint.original.exchanges[start : checkpoint.cut_index]
        remainder.write_bytes(b"".join(exchange.to_line() for exchange in exchanges))
        cut = checkpoint.cut_index - start
        return {"replay": ReplayConfig(trajectory_path=remainder, cut_index=cut, divergence_policy="warn")}
    original = checkpoint.original.path
    replay = ReplayConfig(
        trajectory_path=RunPaths(original).trajectory,
        cut_index=checkpoint.cut_index,
        divergence_policy=settings.divergence_policy,
    )
    recorded_values = recorded_sandbox_values(original)
    return {"replay": replay, "recorded_values": recorded_values, "recorded": checkpoint.recorded_turns}


def _run_config(origin: Origin, live_model: ModelSpec | None, settings: RolloutSettings) -> RunConfig:
    """config.json of the new rollout: the recording's fresh one, or the original's updated
    (`settings` are then the continuation's, `reroll.settings.continuation_settings`)."""
    live_spec = live_model.spec if live_model else None
    started_at = now_iso()
    written: dict[str, Any] = {
        "sandbox": settings.sandbox or DEFAULT_SANDBOX,
        "sandbox_config": settings.recorded_sandbox_config(),
        "network": settings.network,
        "environment_manifest": str(settings.environment_manifest) if settings.environment_manifest else None,
        "environment_services": list(settings.environment_services)
        if settings.environment_services
        else None,
        "reroll_version": __version__,
        "faults": settings.faults,
        "judge_model": settings.judge_model,
        "learner_store": settings.learner_store,
        "ask_user": bool(settings.ask_user),
        "without_mcp": bool(settings.without_mcp),
        "user_model": settings.user_model,
        "max_steps": settings.max_steps,
        "started_at": started_at,
    }
    if isinstance(origin, NewRecording):
        return RunConfig(
            task_path=str(origin.task.path),
            task_name=origin.task.name,
            agent=origin.agent.name,
            model=live_spec,
            timeout_sec=settings.timeout_seconds or origin.task.spec.agent.timeout_sec,
            lineage_started_at=started_at,
            trial=origin.trial,
            **written,
        )
    original = origin.checkpoint.original.config
    key = "branched_from" if isinstance(origin.provenance, BranchedFrom) else "continued_from"
    return original.model_copy(
        update=written
        | {
            "agent": origin.checkpoint.agent.name,  # `continue --agent` may override the recorded one
            "model": live_spec or original.model,
            "timeout_sec": settings.timeout_seconds or origin.checkpoint.task.spec.agent.timeout_sec,
            "lineage_started_at": original.lineage_started_at or original.started_at or started_at,
            "continued_from": None,
            "branched_from": None,
            "rescored_from": None,
            "trial": origin.trial(),
            key: origin.provenance,
        }
    )


@contextlib.contextmanager
def _progress(console: Console | None, run_dir: Path) -> Iterator[Console]:
    """`console`, or a console writing to the run folder's ``harness/controller.log``."""
    if console is not None:
        yield console
        return
    paths = RunPaths(run_dir)
    paths.make_harness()
    log_file = paths.controller_log
    with open(log_file, "w") as log:
        yield Console(file=log, highlight=False, soft_wrap=True)


def load_runnable_task(path: Path) -> Task:
    """The task at `path` as every rollout takes it: loaded (`reroll.tasks.task.load_task`) and
    its verifier built (`reroll.rollout.verify.verifiers.verifier_for`: an llm-judge's rubric, an
    agent-judge's role section …). ``reroll run``, ``reroll job`` and ``reroll task check`` all
    load through here, so the check says "does not load" exactly where a run refuses the task.

    Raises:
        TaskError: the task does not load, or its verifier cannot be built.
    """
    task = load_task(path)
    verifier_for(task)
    return task


def model_for(agent: AgentSpec, model: str | None, task: Task) -> ModelSpec | None:
    """The parsed live model for `agent` (None for agents that call none).

    Raises:
        TaskError: the agent calls a model and `model` is None.
        ModelError: `model` cannot be parsed (see `reroll.models.spec.parse_model`).
    """
    if agent.api_format == "none":
        return None
    if model is None:
        raise TaskError("this agent calls a model: pass --model (e.g. --model scripted)")
    return parse_model(model, task.path, agent.name)
