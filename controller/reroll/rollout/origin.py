"""Where a new rollout starts: its `Origin`, a `NewRecording` or `FromCheckpoint` of a recorded
run — what `reroll.rollout.start.start_rollout` takes, and what the rollout's extensions read
(`reroll.rollout.hooks.Draft`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reroll.agents import AgentSpec
from reroll.rollout.checkpoint import Checkpoint
from reroll.runfolder.run import ContinuedFrom
from reroll.tasks.task import Task
from reroll.trials.config import Scene, TrialConfig


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
    pool: str | None = None
    """With `layers`: a kept copy-on-write snapshot of that step (``<pool>:step-K``,
    `reroll.sandbox.local.storage.PoolSnapshot`) the sandbox starts from (``from_snapshot``, not
    recorded in config.json); the layers it holds (workspace, session) are not restored again."""
    layers_step: int | None = None
    """The step of `layers` when it is earlier than the cut (a branch from the nearest earlier
    checkpoint): the rollout restores it, then the proxy replays the recorded exchanges from that
    step to the cut before it goes live; None: `layers` is of the cut."""
    dump_process: bool = False
    """A branch's rebuilt prefix of an agent whose conversation is in its memory: the tree is
    dumped at the cut into the checkpoint's ``process`` layer (`reroll.rollout.process_layer`)."""

    def trial(self) -> TrialConfig | None:
        """The trial the rollout runs: the original's, or with `layers` one turn told
        `RESUME_PROMPT` (its agent resumes the restored session)."""
        if self.layers is None:
            return self.checkpoint.original.config.trial
        return TrialConfig(scenes=[Scene.single(prompt=RESUME_PROMPT)])  # resumed: `RolloutPlan.restore_from`


Origin = NewRecording | FromCheckpoint
"""Where a rollout starts: from scratch, or from a checkpoint of a recorded run."""
