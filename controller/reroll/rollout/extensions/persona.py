"""A persona User as a rollout extension: ``--user-model`` checked before anything is written,
a replayed run's persona exchanges found, and the scheduler told how to open the persona's model
(`reroll.rollout.turns.persona`)."""

from __future__ import annotations

import dataclasses

from reroll_contracts.errors import ModelError, TrialError

from reroll.models.spec import parse_model
from reroll.rollout.hooks import Draft, Extension, Run
from reroll.rollout.origin import FromCheckpoint
from reroll.rollout.turns.persona import PersonaPlan, persona_model


class Persona(Extension):
    """Option read: ``user_model`` (`reroll.settings.RolloutSettings`)."""

    def __init__(self) -> None:
        self.plan = PersonaPlan()

    def configure(self, draft: Draft) -> None:
        """The persona's plan: a replayed run's recorded exchanges, the User's model checked.

        Raises:
            TrialError: ``--user-model`` is given to a trial without a persona.
            ModelError: the persona's model is none, or an unusable one (the message names the
                variable or ``--user-model``).
            RunFolderError: the original's persona recording lacks exchanges its records name.
        """
        origin, given = draft.origin, draft.given.user_model
        plan = PersonaPlan()
        if isinstance(origin, FromCheckpoint) and origin.layers is None:
            checkpoint = origin.checkpoint
            plan = PersonaPlan.from_recorded(
                checkpoint.original.path,
                checkpoint.recorded_asks,
                checkpoint.recorded_turns,
                live=not origin.provenance.replay_only,
            )
        if given is not None and draft.trial.persona is None:
            raise TrialError("--user-model: the trial has no persona (a scene's `persona`) to play")
        if given is not None:  # a scripted:PATH is stored absolute
            draft.config = draft.config.model_copy(update={"user_model": parse_model(given, None).spec})
        self.plan = dataclasses.replace(plan, user_model=draft.config.user_model)
        if draft.trial.persona is not None and self.plan.live:  # its model is refused now
            spec = persona_model(draft.trial.persona, self.plan)
            try:
                parse_model(spec, None)
            except ModelError as exc:
                named = "--user-model" if draft.config.user_model else "the trial persona's `model`"
                raise ModelError(
                    f"the User's model {spec!r} ({named}) cannot be used: {exc}; "
                    "set it, or pass --user-model SPEC (e.g. anthropic/NAME, openai/NAME, scripted:PATH)"
                ) from exc

    async def before_agent(self, run: Run) -> None:
        """Give the scheduler the persona's plan."""
        assert run.trial is not None
        run.trial.persona = self.plan
