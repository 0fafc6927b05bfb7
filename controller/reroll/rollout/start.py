"""The one path of every new rollout: `start_rollout`.

Every rollout reroll starts — a recording (`reroll.rollout.record.run_task`), a continuation
(`reroll.rollout.continue_.continue_run`), a replay check (`reroll.rollout.replay.replay_run`) and each branch
(`reroll.jobs.branch`) — goes through `start_rollout`: from an origin (a `NewRecording`, or a
`reroll.rollout.checkpoint.Checkpoint` of a recorded run) it creates the new run folder, writes the one
`RunConfig` (with its provenance), and executes the `RolloutPlan` (`reroll.rollout.lifecycle`). The callers
differ only in how they pick the origin, the live model and the provenance.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reroll_contracts.errors import AgentError, TaskError, TrialError
from reroll_contracts.proxy import ReplayConfig, VolatileRule
from rich.console import Console

from reroll import __version__
from reroll.agents import AgentSpec, get_agent
from reroll.host.llm_proxy import recorded_sandbox_values
from reroll.models.spec import ModelSpec, parse_model
from reroll.rollout.asks import Answerer
from reroll.rollout.checkpoint import Checkpoint
from reroll.rollout.lifecycle import execute_rollout
from reroll.rollout.mcp import mcp_servers_for
from reroll.rollout.persona import PersonaPlan, persona_model
from reroll.rollout.plan import RolloutPlan
from reroll.rollout.scenes import check_trial
from reroll.rollout.skills import select_skills, self_gen_trial, skill_config
from reroll.rollout.verifiers import verifier_for
from reroll.runfolder.asks import AskRecord
from reroll.runfolder.run import (
    CONTROLLER_LOG,
    TRAJECTORY,
    BranchedFrom,
    ContinuedFrom,
    RescoredFrom,
    RunConfig,
    RunResult,
    create_run_folder,
    harness_folder,
    now_iso,
)
from reroll.runfolder.store import load_generation
from reroll.runfolder.trial import TurnRecord
from reroll.sandbox.base import WITHOUT_NETWORK_POLICY, load_backend
from reroll.settings import RolloutSettings, continuation_settings, recorded_settings
from reroll.tasks.skills import nudge_level
from reroll.tasks.task import Task, with_network, with_skills_hidden
from reroll.trials.config import DEFAULT_SKILL_MODE, Scene, SkillMode, SkillNudge, TrialConfig


@dataclass(frozen=True)
class RolloutOutcome:
    """A finished rollout: where its folder is and what result.json says."""

    run_dir: Path
    result: RunResult


@dataclass(frozen=True)
class NewRecording:
    """The origin of a fresh recording: a task and an agent (or a trial), nothing to replay."""

    task: Task
    agent: AgentSpec
    """The agent (of a trial: its first role's)."""
    trial: TrialConfig | None = None
    """The scenes, roles and turns, resolved (`reroll.trials.config`); None: `agent` told the
    instruction once."""


RESUME_PROMPT = "Continue the task from where you left off."
"""What a rollout forked from checkpoint layers tells the resumed session (`FromCheckpoint.layers`)."""


@dataclass(frozen=True)
class FromCheckpoint:
    """The origin of a rollout that replays a checkpoint of a recorded run, then goes live — or,
    with `layers`, that starts from the checkpoint's captured layers without replaying."""

    checkpoint: Checkpoint
    provenance: ContinuedFrom
    """config.json's ``continued_from`` — or ``branched_from`` when it is a `BranchedFrom`."""
    layers: Path | None = None
    """A checkpoint folder of the run at ``checkpoint.cut_index`` (`reroll.rollout.layers`): its
    environment state, workspace and agent session are restored before the agent starts, and the
    agent resumes its session (its ``resume`` command, told `RESUME_PROMPT`) with the proxy live
    from the first request; the run folder's trajectory holds the exchanges after the cut."""

    def trial(self) -> TrialConfig | None:
        """The trial the rollout runs: the original's, or with `layers` one turn told
        `RESUME_PROMPT` (its agent resumes the restored session)."""
        if self.layers is None:
            return self.checkpoint.original.config.trial
        return TrialConfig(scenes=[Scene.single(prompt=RESUME_PROMPT)])  # resumed: `RolloutPlan.restore_from`


Origin = NewRecording | FromCheckpoint
"""Where a rollout starts: from scratch, or from a checkpoint of a recorded run."""


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
    """Create the run folder ``parent/name``, write its config, and run the rollout.

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
        SandboxBackendError: the sandbox backend is unknown, or its package is missing, or its
            settings are invalid.
        TaskError: network ``none`` is asked of a sandbox without a network policy, or the
            task's ``verifier.type`` is unknown or refuses its ``verifier.options``.
        ModelError: the judge model cannot be used (``--judge-model``), or the persona User's
            (``--user-model``, else the trial's persona's): none, or an unusable one.
        AgentError: a role's agent is unknown, or cannot take the task's MCP servers that are
            not optional (`reroll.rollout.mcp.mcp_servers_for`).
        TrialError: the trial's roles name different models, a User cannot be loaded, a
            ``resume`` turn's agent has no session to resume, or ``--user-model`` is given to a
            trial without a persona.
        RunFolderError: the original's persona recording lacks exchanges its records name
            (`reroll.rollout.persona.PersonaPlan.from_recorded`).
        StoreError: the learner store generation to mount is missing or corrupt.
        TaskError: also: ``--skills-dir`` without ``with-skill``, ``with-skill`` without skills, a
            skills folder that is missing or holds a folder without SKILL.md, or a bad
            ``$REROLL_SKILL_NUDGE`` (`reroll.rollout.skills.select_skills`).
        Nothing is written when any of these is raised.
    """
    given = options
    if isinstance(origin, FromCheckpoint):
        options = continuation_settings(recorded_settings(origin.checkpoint.original.config), given)
    config = _run_config(origin, live_model, options).model_copy(update={"rescored_from": rescored_from})
    backend = load_backend(config.sandbox).settings(config.sandbox_config)
    config = config.model_copy(update={"sandbox_config": backend.model_dump(mode="json", exclude_unset=True)})
    if config.network == "none" and config.sandbox in WITHOUT_NETWORK_POLICY:
        raise TaskError(
            f"--network none needs --sandbox local or docker: "
            f"the {config.sandbox} sandbox has the host's network"
        )
    recorded: list[TurnRecord] = []
    recorded_asks: list[AskRecord] = []
    branch_answer: str | None = None
    replay: ReplayConfig | None = None
    recorded_values: tuple[VolatileRule, ...] = ()
    persona = PersonaPlan()
    if isinstance(origin, NewRecording):
        task, agent = origin.task, origin.agent
    elif origin.layers is not None:  # forked: nothing replayed, the session resumed
        task, agent = origin.checkpoint.task, origin.checkpoint.agent
    else:
        checkpoint = origin.checkpoint
        task, agent, original = checkpoint.task, checkpoint.agent, checkpoint.original
        recorded = checkpoint.recorded_turns
        recorded_asks = checkpoint.recorded_asks
        branch_answer = origin.provenance.answer if isinstance(origin.provenance, BranchedFrom) else None
        replay = ReplayConfig(
            trajectory_path=original.path / TRAJECTORY,
            cut_index=checkpoint.cut_index,
            divergence_policy=options.divergence_policy,
        )
        recorded_values = recorded_sandbox_values(original.path)
        persona = PersonaPlan.from_recorded(
            original.path, recorded_asks, recorded, live=not origin.provenance.replay_only
        )
    trial = (config.trial or TrialConfig.single()).resolved(agent.name, config.model)
    skills = select_skills(task, *_skill_request(origin, options))
    config = config.model_copy(update=skill_config(skills) | {"skill_nudge": _nudge(origin)})
    if skills.mode == "self-gen":
        trial = self_gen_trial(trial, task.instruction)
        config = config.model_copy(update={"trial": trial})
    agents = {agent.name: agent} | {name: get_agent(name) for name in trial.agents if name != agent.name}
    check_trial(trial, agents)
    if config.ask_user:
        _check_ask_user(agents)
    for role_agent in agents.values():  # an agent without the MCP client the task needs is refused now
        mcp_servers_for(role_agent, task.spec.environment.mcp_servers)
    verifier_for(task)  # an unknown verifier.type is refused before anything is written
    if (store := config.learner_store) is not None:
        load_generation(Path(store.path), store.generation)
    if given.judge_model is not None:  # refused now; a scripted:PATH is stored absolute
        config = config.model_copy(update={"judge_model": parse_model(given.judge_model, task.path).spec})
    if given.user_model is not None and trial.persona is None:
        raise TrialError("--user-model: the trial has no persona (a scene's `persona`) to play")
    if given.user_model is not None:  # the same
        config = config.model_copy(update={"user_model": parse_model(given.user_model, None).spec})
    persona = dataclasses.replace(persona, user_model=config.user_model)
    if trial.persona is not None and persona.live:  # its model is refused now
        parse_model(persona_model(trial.persona, persona), None)
    run_dir = create_run_folder(parent, name)
    plan = RolloutPlan(
        task=with_skills_hidden(with_network(task, config.network), config.skill_source != "task_bundled"),
        agents=agents,
        trial=trial,
        run_dir=run_dir,
        config=config,
        replay=replay,
        recorded_values=recorded_values,
        recorded=recorded,
        skills=skills,
        asks=Answerer(run_dir, recorded_asks, branch_answer) if config.ask_user else None,
        persona=persona,
        settings=options,
        restore_from=origin.layers if isinstance(origin, FromCheckpoint) else None,
        restore_step=origin.checkpoint.cut_index if isinstance(origin, FromCheckpoint) else 0,
    )
    with _progress(console, run_dir) as progress:
        progress.print(f"run folder: {run_dir}")
        return RolloutOutcome(run_dir, await execute_rollout(plan, progress, start_gate))


def _check_ask_user(agents: dict[str, AgentSpec]) -> None:
    """Refuse ask_user to a rollout with an agent that has no MCP client (the tool is offered over MCP).

    Raises:
        AgentError: one of `agents` calls a model but has no MCP client.
    """
    without = [name for name, agent in agents.items() if agent.mcp is None and agent.api_format != "none"]
    if without:
        raise AgentError(
            f"--ask-user: the ask_user tool is offered over MCP, and {', '.join(without)} has no MCP client; "
            "use an agent that has one (claude-code, codex, openhands)"
        )


def _run_config(origin: Origin, live_model: ModelSpec | None, settings: RolloutSettings) -> RunConfig:
    """config.json of the new rollout: the recording's fresh one, or the original's updated
    (`settings` are then the continuation's, `reroll.settings.continuation_settings`)."""
    live_spec = live_model.spec if live_model else None
    started_at = now_iso()
    written: dict[str, Any] = {
        "sandbox": settings.sandbox or "local",
        "sandbox_config": dict(settings.sandbox_config or {}),
        "network": settings.network,
        "reroll_version": __version__,
        "faults": settings.faults,
        "judge_model": settings.judge_model,
        "learner_store": settings.learner_store,
        "ask_user": bool(settings.ask_user),
        "user_model": settings.user_model,
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


def _skill_request(origin: Origin, settings: RolloutSettings) -> tuple[SkillMode, Path | None]:
    """The skill mode and ``--skills-dir`` of the new rollout (see `RolloutSettings.skill_mode`)."""
    if isinstance(origin, NewRecording):
        trial = origin.trial or TrialConfig.single()
        return (
            settings.skill_mode or trial.skills or DEFAULT_SKILL_MODE,
            settings.skills_dir or trial.skills_dir,
        )
    return settings.skill_mode or DEFAULT_SKILL_MODE, settings.skills_dir


def _nudge(origin: Origin) -> SkillNudge | None:
    """The nudge asked for now (`reroll.tasks.skills.nudge_level`), else the original's."""
    if isinstance(origin, NewRecording):
        return nudge_level()
    return nudge_level() or origin.checkpoint.original.config.skill_nudge


@contextlib.contextmanager
def _progress(console: Console | None, run_dir: Path) -> Iterator[Console]:
    """`console`, or a console writing to the run folder's ``harness/controller.log``."""
    if console is not None:
        yield console
        return
    log_file = harness_folder(run_dir) / CONTROLLER_LOG.name
    with open(log_file, "w") as log:
        yield Console(file=log, highlight=False, soft_wrap=True)


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
