"""``asks.json`` in a run folder: the agent's ask_user questions and the answers it got.

Written after each answer (`reroll.rollout.turns.asks`); ``reroll branch --at-ask N`` reads it: question
N's ``step`` is the cut of the branches that answer it otherwise, its ``options`` their answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from reroll_contracts.asks import AskQuestion
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import RunFolderError
from reroll_contracts.trajectory import Place

from reroll.runfolder.run import MAX_JSON_BYTES

ASKS_FILE = "asks.json"
"""In the run folder: an `AskLog`."""

AnsweredBy = Literal["user", "recorded", "branch", "nobody"]
"""Who answered: ``user``: the scene's User (`reroll.trials.users.BaseUser.answer`); ``recorded``: a
continuation gave the original's answer again (its next exchange is replayed); ``branch``: a
branch's ``--at-ask`` option or ``--answer``; ``nobody``: there was no User to ask (a plain run,
or a User without ``answer``): the agent was told so."""


class AskRecord(AskQuestion):
    """One question and its answer."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0)
    """Its number in the run (0-based): what ``--at-ask`` names."""
    step: int = Field(ge=0)
    """How many exchanges the run had made when it was asked (the next exchange carries the answer)."""
    place: Place | None = None
    """Where in the trial."""
    asked_at: str
    answer: str
    answered_by: AnsweredBy
    user_exchange: int | None = Field(default=None, ge=0)
    """The exchange of a persona User's model that gave the answer (its line in
    ``trajectory/user_trajectory.jsonl``, 0-based; `reroll.rollout.turns.persona`), served again from
    the recording by a continuation; None: no model gave it."""


class AskLog(BaseModel):
    """``asks.json``: the run's questions in the order asked."""

    model_config = ConfigDict(extra="forbid")
    asks: list[AskRecord] = []


def load_asks(run_dir: Path) -> list[AskRecord]:
    """The questions of `run_dir`; none when it has no ``asks.json`` (the agent asked nothing).

    Raises:
        RunFolderError: the file is not a valid `AskLog`, a symlink, not a regular file or larger
            than `MAX_JSON_BYTES` (the message names it).
    """
    file = run_dir / ASKS_FILE
    try:
        return AskLog.model_validate_json(read_data_file(file, MAX_JSON_BYTES, root=run_dir)).asks
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:  # ValueError: ValidationError, DataFileError
        raise RunFolderError(f"{file}: invalid: {exc}") from exc
