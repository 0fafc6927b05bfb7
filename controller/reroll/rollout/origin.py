"""Where a new rollout starts and how it runs: its `Origin` (a `NewRecording`, or `FromCheckpoint`
of a recorded run) and its `RolloutOptions` — what `reroll.rollout.start.start_rollout` takes, and
what the rollout's extensions read (`reroll.rollout.hooks.Draft`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reroll_contracts.faults import FaultsUsed
from reroll_contracts.network import NetworkPolicy
from reroll_contracts.proxy import DivergencePolicy

from reroll.agents import AgentSpec
from reroll.models.spec import script_file, with_script_file
from reroll.rollout.checkpoint import Checkpoint
from reroll.runfolder.run import ContinuedFrom, StoreUse
from reroll.tasks.task import Task
from reroll.trials.config import Scene, SkillMode, TrialConfig


@dataclass(frozen=True)
class RolloutOptions:
    """How a new rollout runs: the flags ``run``, ``continue``, ``replay`` and ``branch`` share.

    Every None takes the default named; for a rollout from a checkpoint, "the original's" is
    what the recorded run's config.json says.
    """

    timeout_seconds: float | None = None
    """The agent's wall-clock budget, seconds [default: the original's, else the task's]."""
    sandbox: str | None = None
    """Sandbox backend, ``local`` or ``docker`` [default: the original's, else ``local``]."""
    sandbox_config: Mapping[str, Any] | None = None
    """Settings of the sandbox backend, validated by its config model (`reroll.sandbox.base.Backend`),
    e.g. ``{"image_map": {...}}`` for docker. From a checkpoint on the original's backend, they
    update the original's settings key by key (so its recorded ``image_map`` rebuilds the same
    image); on another backend, the original's are dropped [default: the original's, else none]."""
    network: NetworkPolicy | None = None
    """The sandbox's network policy [default: the original's override, else the task's
    ``environment.network``]; ``none`` needs docker or the isolated ``local``."""
    faults: FaultsUsed | None = None
    """The fault plan the proxy injects (`reroll.host.llm_proxy.faults_used`), or None; faults
    recorded in a replayed trajectory are reproduced either way (not inherited as a plan)."""
    checkpoint_every: int = 0
    """Capture a three-layer checkpoint every this many steps while the agent runs live
    (`reroll.rollout.layers`; ``<run>/checkpoints/step-K/``), which ``branch --via snapshot``
    forks from instead of rebuilding the prefix; 0: none."""
    divergence_policy: DivergencePolicy = "warn"
    """What the proxy does when a replayed request differs from the recording (``warn``,
    ``strict``, ``cutover``); a recording replays nothing, so it never applies there."""
    learner_store: StoreUse | None = None
    """A new recording's learner store generation (a ``sequential-shared`` job's rollout,
    `reroll.jobs.learning`); None: none. A rollout from a checkpoint mounts this generation
    (`with_recorded_inputs` binds the original's) [default: the original's], always read-only to
    the store (``writes_back`` False)."""
    skill_mode: SkillMode | None = None
    """How the agents get skills (`reroll.rollout.skills`) [default: the original's, else the
    trial's, else ``no-skill``]."""
    skills_dir: Path | None = None
    """The skills folder of ``with-skill`` [default: the original's ``--skills-dir``, else the
    trial's, else the task's ``environment/skills``]."""
    judge_model: str | None = None
    """A judge's model (``--judge-model``: an LLM or agent judge's) [default: the original's, else
    the task's]."""
    ask_user: bool = False
    """Offer the agent reroll's ``ask_user`` tool over MCP (`reroll.rollout.asks`) [default: the
    original's, else not]; every agent of the rollout must have an MCP client."""
    user_model: str | None = None
    """A persona User's model (``--user-model``, `reroll.rollout.persona`) [default: the
    original's, else the trial's persona's ``model``]."""

    def paths_read(self) -> tuple[Path, ...]:
        """The host paths these options name, which the rollout reads (what an executor on another
        machine carries there, `reroll.jobs.ray_executor`): the skills folder, the learner store's
        folder, a judge's and a persona User's script file (``scripted:PATH``); absolute, in that
        order."""
        store = Path(self.learner_store.path) if self.learner_store is not None else None
        judge = script_file(self.judge_model) if self.judge_model is not None else None
        user = script_file(self.user_model) if self.user_model is not None else None
        return tuple(path for path in (self.skills_dir, store, judge, user) if path is not None)

    def relocated(self, moved: Callable[[Path], Path]) -> RolloutOptions:
        """These options with each path of `paths_read` replaced by ``moved(path)``."""
        store = self.learner_store
        if store is not None:
            store = store.model_copy(update={"path": str(moved(Path(store.path)))})

        def moved_script(spec: str | None) -> str | None:
            if spec is None or (script := script_file(spec)) is None:
                return spec
            return with_script_file(spec, moved(script))

        skills_dir = moved(self.skills_dir) if self.skills_dir is not None else None
        return dataclasses.replace(
            self,
            skills_dir=skills_dir,
            learner_store=store,
            judge_model=moved_script(self.judge_model),
            user_model=moved_script(self.user_model),
        )


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
