"""Resolving ``--at`` to a cut index."""

from __future__ import annotations

from pathlib import Path

import pytest
from reroll.checkpoint import At, resolve_cut
from reroll.errors import RunFolderError

RUN = Path("/runs/r1")


@pytest.mark.parametrize(
    ("at", "expected"),
    [(None, 5), (0, 0), (5, 5), ("3", 3), (" 2 ", 2), (0.5, 2), ("0.5", 2), (0.0, 0), ("1.0", 5), (0.99, 4)],
)
def test_steps_and_fractions(at: At | None, expected: int) -> None:
    assert resolve_cut(at, 5, RUN) == expected


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (6, "--at 6 is out of range: the run has 5 recorded exchanges, so a step must be within 0..5"),
        (-1, "--at -1 is out of range"),
        ("7", "--at 7 is out of range"),
        (1.5, "--at 1.5: a fraction must be within 0.0..1.0"),
        ("-0.1", "a fraction must be within 0.0..1.0"),
        ("nan", "expected a step index (0..5) or a fraction"),
        ("half", "--at 'half': expected a step index (0..5) or a fraction"),
        (True, "expected a step index or a fraction"),
    ],
)
def test_bad_checkpoints_name_the_run_and_the_range(at: At, message: str) -> None:
    with pytest.raises(RunFolderError, match=r"^/runs/r1: ") as caught:
        resolve_cut(at, 5, RUN)
    assert message in str(caught.value)


def test_an_empty_recording_only_has_step_zero() -> None:
    assert resolve_cut(0.5, 0, RUN) == 0
    with pytest.raises(RunFolderError, match=r"within 0\.\.0"):
        resolve_cut(1, 0, RUN)
