"""The User of ask-the-user.yaml: gives the task's instruction once and, asked, says it reads French."""

from __future__ import annotations

from reroll.trials.users import BaseUser, RoundResult


class FrenchReader(BaseUser):
    """A User who reads French (the task's instruction does not say so)."""

    def run(self, round: int, instruction: str, round_result: RoundResult | None) -> str | None:
        """The instruction in round 0; nothing more."""
        return instruction if round == 0 else None

    def answer(self, question: str, options: list[str]) -> str:
        """French: the option that names it, else in words."""
        return next((option for option in options if "french" in option.lower()), "French, please.")
