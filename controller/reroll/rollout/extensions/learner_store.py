"""The learner store as a rollout extension: the generation checked before anything is written,
mounted once the sandbox started, harvested when the workspace is final (the store itself:
`reroll.rollout.learner_store`, `reroll.runfolder.store`)."""

from __future__ import annotations

from pathlib import Path

from reroll.rollout.hooks import Draft, Extension, Run
from reroll.rollout.learner_store import harvest_learner_store, mount_learner_store
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.runfolder.store import load_generation


class LearnerStore(Extension):
    """Option read: config.json's ``learner_store`` (`reroll.settings.RolloutSettings.learner_store`)."""

    def configure(self, draft: Draft) -> None:
        """Refuse a generation that is missing or corrupt.

        Raises:
            StoreError: the generation to mount is missing or corrupt.
        """
        if (store := draft.config.learner_store) is not None:
            load_generation(Path(store.path), store.generation)

    async def after_sandbox_start(self, run: Run) -> None:
        """Mount the generation; its environment goes into ``run.env``."""
        if (store := run.plan.config.learner_store) is None:
            return
        run.console.print(f"[dim]learner store: generation {store.generation}[/dim]")
        run.env |= await mount_learner_store(run.sandbox, store, run.env)

    async def before_verify(self, run: Run, outcome: AgentOutcome) -> None:
        """Harvest what the rollout wrote into the store (when it writes back) into result.json."""
        store = run.plan.config.learner_store
        if store is not None and store.writes_back:
            run.result.learner_store = await harvest_learner_store(run.sandbox, Path(store.path))
