"""Checkpoints of a recorded run: where a continuation, a replay check or a branch cuts over.

`open_checkpoint` loads a run folder, finds its task and agent and resolves the cut: the
`Checkpoint` it returns is what `reroll.rollout.start.start_rollout` continues from.

A checkpoint is a cut index K: the first K recorded exchanges are replayed, the (K+1)-th request
goes to the live model. It is given (``--at``, or ``at=`` in the Python API) either

- as a step index, an ``int`` (or a string of digits): ``0`` goes live at once, ``N`` (the
  number of recorded exchanges) replays them all; or
- as a fraction of the recorded exchanges, a ``float`` (or a string with a decimal point) in
  0.0..1.0: K = floor(fraction * N), so ``0.5`` of 5 exchanges is K = 2;
- in a trial (`reroll.trials.config`), as ``TURN:STEP``: the STEP-th exchange of turn TURN (a User's
  round is a turn; `reroll_contracts.trajectory.Place`), e.g. ``3:0`` replays turns 0..2 and goes live
  at the first exchange of turn 3.

A continuation of a trial re-sends the recorded prompts of the turns the checkpoint reaches
(`Checkpoint.recorded_turns`) — the User is not called for them — and runs the rest live: with
``TURN:STEP``, turns 0..TURN; with a step K, every turn that started at or before K (so ``--at
K`` at a round boundary re-sends the next round's prompt, and ``--at TURN:END`` — END that
turn's exchange count — lets the User decide the next round live).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from reroll_contracts.errors import RunFolderError, TaskError
from reroll_contracts.trajectory import Exchange, Place
from rich.console import Console

from reroll.agents import AgentSpec, get_agent
from reroll.models.spec import model_name
from reroll.runfolder.asks import AskRecord, load_asks
from reroll.runfolder.run import ContinuedFrom, RunConfig, RunFolder, load_run_folder
from reroll.runfolder.trial import TurnRecord, load_trial_record
from reroll.tasks.task import Task, find_task, load_task
from reroll.trials.config import DEFAULT_ROLE, DEFAULT_SCENE

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


@dataclass(frozen=True)
class Checkpoint:
    """A recorded run opened for replay up to a cut index (`open_checkpoint`)."""

    original: RunFolder
    task: Task
    """The original's task (found at the recorded path, or by name in a tasks dir)."""
    agent: AgentSpec
    status: str
    """The original's status (``ok``, ``timeout``, ``error``, or ``unknown`` without result.json)."""
    cut_index: int
    """How many recorded exchanges are replayed before the live model takes over."""
    at: str | None
    """The checkpoint as given (``--at``), None for the end of the recording."""
    recorded_turns: list[TurnRecord] = field(default_factory=list)
    """The original's turns whose prompts a continuation re-sends as recorded (the module docstring)."""
    recorded_asks: list[AskRecord] = field(default_factory=list)
    """The original's ask_user questions before the cut (their answers are in replayed exchanges):
    a continuation answers them as recorded (`reroll.rollout.turns.asks`)."""

    @property
    def agent_model(self) -> str:
        """The model name the original agent asked for (a continuation keeps it); "" for none."""
        return model_name(self.original.config.model) if self.original.config.model else ""

    def continued_from(self, live_model: str | None, *, replay_only: bool = False) -> ContinuedFrom:
        """The provenance of a continuation of this checkpoint (config.json's ``continued_from``).

        Args:
            live_model: the spec of the model after the cut, None when none goes live.
            replay_only: the continuation stops at the cut point.
        """
        return ContinuedFrom(
            path=str(self.original.path),
            status=self.status,
            cut_index=self.cut_index,
            at=self.at,
            original_model=self.original.config.model,
            live_model=live_model,
            replay_only=replay_only,
        )

    def with_prompt(self, prompt: str) -> Checkpoint:
        """This checkpoint with `prompt` instead of the recorded prompt of the turn its cut starts
        (``branch --prompt``): the cut must be that turn's first exchange (``--at TURN:0``), as
        the prompt is in every request of the turn.

        Raises:
            RunFolderError: the cut is not at the start of a recorded turn.
        """
        turn = len(self.recorded_turns) - 1
        if turn < 0 or first_step(self.original.exchanges, turn) != self.cut_index:
            turns = range(len(recorded_turns(self.original)))
            starts = [first_step(self.original.exchanges, index) for index in turns]
            raise RunFolderError(
                f"{self.original.path}: --prompt needs a cut at the start of a turn (--at TURN:0), as the "
                f"turn's prompt is in every request it makes; --at {self.at} cuts at exchange "
                f"{self.cut_index}, and the turns start at {starts or 'no exchange (no turn recorded)'}"
            )
        recorded = self.recorded_turns[turn].model_copy(update={"prompt": prompt, "prompt_source": "branch"})
        return replace(self, recorded_turns=[*self.recorded_turns[:turn], recorded])


def open_checkpoint(
    run_folder: Path | RunFolder,
    *,
    at: At | None = None,
    tasks_dir: Path | None = None,
    require_timeout: bool = False,
    console: Console | None = None,
    agent: str | None = None,
) -> Checkpoint:
    """Load `run_folder`, find its task and agent, and resolve `at` to a cut index.

    Args:
        run_folder: the recorded run (its folder, or the folder loaded already: a caller that opens
            several checkpoints of one run reads it once).
        at: the checkpoint (see the module docstring); None: the end of the recording.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        require_timeout: refuse a run whose status is not ``timeout``.
        console: where a warning about a truncated trajectory goes [default: nowhere].
        agent: the agent that replays and continues the run [default: the recorded one, e.g.
            ``openhands`` in a folder written by BenchFlow].

    Raises:
        RunFolderError: the folder is missing or corrupt (asks.json included), `at` is malformed
            or out of range, or `require_timeout` is set and the run's status is not ``timeout``.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        AgentError: the agent (`agent`, else the recorded one) is unknown; the message says how
            to declare it.
    """
    original = run_folder if isinstance(run_folder, RunFolder) else load_run_folder(run_folder)
    if original.trajectory.warning and console is not None:
        console.print(f"[yellow]warning:[/yellow] {original.trajectory.warning}")
    turns = recorded_turns(original)
    if isinstance(at, str) and ":" in at:
        cut_index, reused = trial_cut(at, turns, original)
    else:
        cut_index = resolve_cut(at, len(original.exchanges), original.path)
        firsts = [first_step(original.exchanges, index) for index in range(len(turns))]
        reused = sum(1 for first in firsts if first <= cut_index)
    status = original.result.effective_status if original.result else "unknown"
    if require_timeout and status != "timeout":
        raise RunFolderError(f"{original.path}: status is {status!r}, not 'timeout' (--require-timeout)")
    task = find_original_task(original.config, tasks_dir)
    spec = get_agent(agent or original.config.agent)
    given = None if at is None else str(at)
    asks = [ask for ask in load_asks(original.path) if ask.step < cut_index]
    return Checkpoint(original, task, spec, status, cut_index, given, turns[:reused], asks)


def recorded_turns(original: RunFolder) -> list[TurnRecord]:
    """The turns `original` ran: its ``trial.json``; for a run without one (a plain run of an
    earlier version, BenchFlow's), one turn holding the first prompt of prompts.json.

    Raises:
        RunFolderError: trial.json is invalid.
    """
    record = load_trial_record(original.path)
    if record is not None:
        return record.turns
    if not original.prompts:
        return []
    place = Place(turn=0, scene=DEFAULT_SCENE, role=DEFAULT_ROLE)
    return [TurnRecord(place=place, prompt=original.prompts[0], prompt_source="instruction", status="ok")]


def first_step(exchanges: list[Exchange], turn: int) -> int:
    """How many exchanges come before turn `turn` (exchanges without a place count as turn 0's)."""
    return sum(1 for exchange in exchanges if _turn_of(exchange) < turn)


def _turn_of(exchange: Exchange) -> int:
    place = exchange.metadata.place
    return place.turn if place is not None else 0


def trial_cut(at: str, turns: list[TurnRecord], original: RunFolder) -> tuple[int, int]:
    """The cut index of ``TURN:STEP`` and how many recorded turns are re-sent (TURN + 1).

    Raises:
        RunFolderError: `at` is malformed, TURN is not a recorded turn, or STEP is outside
            0..(the turn's exchange count).
    """
    turn_text, _, step_text = at.strip().partition(":")
    try:
        turn, step = int(turn_text), int(step_text)
    except ValueError:
        raise RunFolderError(f"{original.path}: --at {at!r}: expected TURN:STEP, two integers") from None
    if not 0 <= turn < len(turns):
        raise RunFolderError(
            f"{original.path}: --at {at}: the run has {len(turns)} recorded turns, so TURN must be within "
            f"0..{len(turns) - 1}"
        )
    steps = sum(1 for exchange in original.exchanges if _turn_of(exchange) == turn)
    if not 0 <= step <= steps:
        raise RunFolderError(
            f"{original.path}: --at {at}: turn {turn} has {steps} recorded exchanges, so STEP must be "
            f"within 0..{steps}"
        )
    return first_step(original.exchanges, turn) + step, turn + 1


def original_task_name(config: RunConfig) -> str:
    """The name a recorded run's task is looked up by in a ``tasks_dir`` (`find_original_task`)."""
    return config.task_name or Path(config.task_path).name


def find_original_task(config: RunConfig, tasks_dir: Path | None) -> Task:
    """The task of the recorded run whose config is `config`: ``tasks_dir/<original_task_name>``
    when `tasks_dir` is given, else the recorded ``task_path``.

    Raises:
        TaskError: the task is not there, or invalid.
    """
    name = original_task_name(config)
    if tasks_dir is not None:
        return find_task(name, tasks_dir)
    if Path(config.task_path).is_dir():
        return load_task(Path(config.task_path))
    raise TaskError(
        f"task {config.task_path} no longer exists; pass --tasks-dir with a folder holding {name!r}"
    )
