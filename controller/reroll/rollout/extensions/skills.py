"""Skills as a rollout extension: the skill mode chosen and recorded before anything is written,
the skills each scene sees mounted as it begins, and what the agents opened or generated counted
into result.json (the skills themselves: `reroll.rollout.skills`)."""

from __future__ import annotations

from pathlib import Path

from reroll_contracts.trajectory import load_trajectory

from reroll.rollout.hooks import Draft, Extension, Run
from reroll.rollout.origin import NewRecording, Origin
from reroll.rollout.skills import SceneSkills, SkillSelection, select_skills, self_gen_trial, skill_config
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.settings import RolloutSettings
from reroll.tasks.skills import nudge_level
from reroll.tasks.variants import with_skills_hidden
from reroll.trials.config import DEFAULT_SKILL_MODE, SkillMode, SkillNudge


class Skills(Extension):
    """Options read: ``skill_mode``, ``skills_dir`` (`reroll.settings.RolloutSettings`)."""

    def __init__(self) -> None:
        self.selection = SkillSelection("no-skill", "none", None, [])
        self.scenes: SceneSkills | None = None

    def configure(self, draft: Draft) -> None:
        """Select the skills (`select_skills`), record them in config.json, prepend the creator
        scene of ``self-gen``, hide the task's bundled skills unless they are the ones mounted or
        an agent runs the task's reference solution (the oracle).

        Raises:
            TaskError: see `reroll.rollout.skills.select_skills`; a bad ``$REROLL_SKILL_NUDGE``.
        """
        self.selection = select_skills(draft.task, *_skill_request(draft.settings))
        draft.config = draft.config.model_copy(
            update=skill_config(self.selection) | {"skill_nudge": _nudge(draft.origin)}
        )
        if self.selection.mode == "self-gen":
            draft.trial = self_gen_trial(draft.trial, draft.task.instruction)
            draft.config = draft.config.model_copy(update={"trial": draft.trial})
        # The reference solution may run a skill's script from the image, as BenchFlow deploys
        # skills for its oracle: an agent that runs it keeps the task's bundled skills there.
        runs_solution = any(agent.needs_solution for agent in draft.agents.values())
        hidden = draft.config.skill_source != "task_bundled" and not runs_solution
        draft.task = with_skills_hidden(draft.task, hidden)

    async def before_agent(self, run: Run) -> None:
        """Give the scheduler the scene hook that mounts each scene's skills and nudges prompts."""
        assert run.trial is not None
        plan = run.plan
        self.scenes = SceneSkills(
            run.sandbox, run.env, plan.agents, self.selection, plan.config.skill_nudge, run.console
        )
        run.trial.hook = self.scenes

    async def before_verify(self, run: Run, outcome: AgentOutcome) -> None:
        """result.json's ``skills_opened`` and ``skills_generated`` (not for ``no-skill``)."""
        if self.selection.mode == "no-skill" or self.scenes is None:
            return
        exchanges = load_trajectory(run.plan.paths.trajectory).exchanges if run.proxy else []
        run.result.skills_opened = self.scenes.opened(exchanges)
        run.result.skills_generated = self.scenes.generated


def _skill_request(settings: RolloutSettings) -> tuple[SkillMode, Path | None]:
    """The skill mode and ``--skills-dir`` of the new rollout (see `RolloutSettings.skill_mode`; a
    trial file's are in `settings` already, `reroll.settings.recording_settings`)."""
    return settings.skill_mode or DEFAULT_SKILL_MODE, settings.skills_dir


def _nudge(origin: Origin) -> SkillNudge | None:
    """The nudge asked for now (`reroll.tasks.skills.nudge_level`), else the original's."""
    if isinstance(origin, NewRecording):
        return nudge_level()
    return nudge_level() or origin.checkpoint.original.config.skill_nudge
