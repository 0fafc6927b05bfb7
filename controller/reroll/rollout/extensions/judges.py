"""The judges as a rollout extension: the judge's model (``--judge-model``, else the task's)
resolved before anything is written, the
verify requests given the judge's model (or, for a re-score without one, the recorded judge
trajectory to serve), and the judge's exchanges counted into result.json (the judges themselves:
`reroll.rollout.verify.judge`, `reroll.rollout.verify.agent_judge`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from reroll_contracts.trajectory import load_trajectory

from reroll.rollout.hooks import Draft, Extension, Run
from reroll.rollout.verify.judge_model import check_judge_model, judge_flag
from reroll.rollout.verify.verifiers import Verdict
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import RunConfig, count_exchanges


class Judges(Extension):
    """Options read: ``judge_model`` (`reroll.settings.RolloutSettings`); config.json's
    ``rescored_from``."""

    def configure(self, draft: Draft) -> None:
        """Refuse an unusable ``--judge-model``, or an unusable model the task's judge names
        (`reroll.rollout.verify.judge_model.check_judge_model`) unless a re-score replays the
        recorded judge; store a ``scripted:PATH`` absolute.

        Raises:
            ModelError: the judge model cannot be used (the message names the variable or flag
                that fixes it).
        """
        if (given := draft.given.judge_model) is not None:
            spec = judge_flag(given, draft.task)
            draft.config = draft.config.model_copy(update={"judge_model": spec})
        if _judge_replay(draft.config) is None:
            check_judge_model(draft.task, draft.config.judge_model)

    async def before_agent(self, run: Run) -> None:
        """The verify requests (final and soft) name the judge's model or recorded trajectory."""
        assert run.trial is not None
        config = run.plan.config
        run.trial.verify_request = dataclasses.replace(
            run.trial.verify_request, judge_model=config.judge_model, judge_replay=_judge_replay(config)
        )

    async def after_verify(self, run: Run, verdict: Verdict) -> None:
        """result.json's ``judge_counts`` when a judge recorded exchanges."""
        if run.plan.paths.judge_trajectory.is_file():
            run.result.judge_counts = count_exchanges(load_trajectory(run.plan.paths.judge_trajectory))


def _judge_replay(config: RunConfig) -> Path | None:
    """The recorded judge trajectory a re-scored run replays (``rescored_from`` without a live
    judge model); None otherwise."""
    rescored = config.rescored_from
    if rescored is None or rescored.judge_model is not None:
        return None
    return RunPaths(Path(rescored.path)).judge_trajectory
