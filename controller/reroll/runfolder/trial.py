"""``trial.json`` in a run folder: the turns a trial ran (place, prompt, how each ended)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import RunFolderError
from reroll_contracts.trajectory import Place

from reroll.runfolder.run import MAX_JSON_BYTES
from reroll.trials.config import PromptSource, TurnStatus

TRIAL_RECORD = "trial.json"
"""In the run folder: the turns a trial ran (a `TrialRecord`)."""


class TurnRecord(BaseModel):
    """One turn that ran: where, what the agent was told, how it ended."""

    model_config = ConfigDict(extra="forbid")
    place: Place
    prompt: str
    """The whole prompt sent (outbox messages included)."""
    prompt_source: PromptSource
    """``instruction``: the task's; ``trial``: the turn's ``prompt``; ``user``: the User decided
    it (live); ``recorded``: a continuation re-sent the original's (the User was not called);
    ``branch``: a branch's ``--prompt`` replaced the original's."""
    resume: bool = False
    """The prompt went to the role's previous session (multi-turn)."""
    status: TurnStatus
    """How the agent's turn ended (``stopped``: the proxy stopped it, replay-only or strict divergence)."""
    exit_code: int | None = None
    rewards: dict[str, float] | None = None
    """The soft verify's rewards after a User's round (None elsewhere, or when it left none)."""
    verifier_error: str | None = None
    """Why the soft verify left no reward, if so."""
    user_exchange: int | None = Field(default=None, ge=0)
    """The exchange of a persona User's model that wrote the prompt (its line in
    ``trajectory/user_trajectory.jsonl``, 0-based; `reroll.rollout.turns.persona`), served again from
    the recording by a continuation; None: no model wrote it."""


class TrialRecord(BaseModel):
    """``trial.json``: the turns a trial ran, in order, and where its Users stopped it."""

    model_config = ConfigDict(extra="forbid")
    turns: list[TurnRecord] = []
    user_stopped: list[str] = []
    """The scenes whose User returned None (ended its rounds before ``max_rounds``)."""


def load_trial_record(run_dir: Path) -> TrialRecord | None:
    """``trial.json`` of `run_dir`; None when it has none (a run of a version without trials, BenchFlow's).

    Raises:
        RunFolderError: the file is not a valid `TrialRecord`, a symlink, not a regular file or
            larger than `MAX_JSON_BYTES` (the message names it).
    """
    file = run_dir / TRIAL_RECORD
    try:
        return TrialRecord.model_validate_json(read_data_file(file, MAX_JSON_BYTES, root=run_dir))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: ValidationError, DataFileError
        raise RunFolderError(f"{file}: invalid: {exc}") from exc
