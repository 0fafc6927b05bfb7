"""The User of progressive-disclosure.yaml (a `reroll.trials.users.FunctionUser` function).

Round 0 gets a terse spec, round 1 the failing tests' output as hints, round 2 the task's full
instruction, every later round the latest failures again; it stops (returns None) as soon as
the soft verify after a round gives reward 1.0.
"""

from __future__ import annotations

from reroll.trials.users import RoundResult

TERSE = "Terse spec: make calc.py correct."
HINT_LINES = 12


def disclose(round: int, instruction: str, result: RoundResult | None) -> str | None:
    """The prompt of `round`, or None once the previous round passed."""
    if result is not None and (result.rewards or {}).get("reward") == 1.0:
        return None
    if round == 0:
        return TERSE
    failures = "\n".join((result.verifier_output if result else "").strip().splitlines()[-HINT_LINES:])
    if round == 1:
        return f"Hint: the verifier's tests fail like this:\n{failures}\nFix calc.py."
    if round == 2:
        return f"Full spec:\n{instruction}"
    return f"Still failing after your change:\n{failures}\nFix calc.py."
