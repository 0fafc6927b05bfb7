"""Checkpoints of a recorded run: where a continuation or a branch cuts over to the live model.

A checkpoint is a cut index K: the first K recorded exchanges are replayed, the (K+1)-th request
goes to the live model. It is given (``--at``, or ``at=`` in the Python API) either

- as a step index, an ``int`` (or a string of digits): ``0`` goes live at once, ``N`` (the
  number of recorded exchanges) replays them all; or
- as a fraction of the recorded exchanges, a ``float`` (or a string with a decimal point) in
  0.0..1.0: K = floor(fraction * N), so ``0.5`` of 5 exchanges is K = 2.
"""

from __future__ import annotations

import math
from pathlib import Path

from reroll.errors import RunFolderError

At = int | float | str
"""A checkpoint as given: a step index, a fraction, or their text (see the module docstring)."""


def resolve_cut(at: At | None, recorded: int, run_folder: Path) -> int:
    """The cut index (the number of exchanges to replay) that `at` names.

    Args:
        at: the checkpoint, or None for the end of the recording.
        recorded: how many exchanges the run folder holds.
        run_folder: the run folder (named in errors).

    Returns:
        K, with 0 <= K <= `recorded`.

    Raises:
        RunFolderError: `at` is malformed, or outside 0..`recorded` (a step) / 0.0..1.0 (a fraction).
    """
    if at is None:
        return recorded
    value = _parse(at, recorded, run_folder)
    if isinstance(value, float):
        if not 0.0 <= value <= 1.0:
            raise RunFolderError(
                f"{run_folder}: --at {at}: a fraction must be within 0.0..1.0 "
                f"(of the {recorded} recorded exchanges)"
            )
        return math.floor(value * recorded)
    if not 0 <= value <= recorded:
        raise RunFolderError(
            f"{run_folder}: --at {at} is out of range: the run has {recorded} recorded exchanges, "
            f"so a step must be within 0..{recorded}"
        )
    return value


def _parse(at: At, recorded: int, run_folder: Path) -> int | float:
    if isinstance(at, bool):
        raise RunFolderError(f"{run_folder}: --at {at!r}: expected a step index or a fraction")
    if isinstance(at, int | float):
        return at
    text = at.strip()
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        raise RunFolderError(
            f"{run_folder}: --at {at!r}: expected a step index (0..{recorded}) or a fraction with a "
            "decimal point (0.0..1.0)"
        ) from None
