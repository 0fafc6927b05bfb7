"""Where the branches of ``reroll branch`` start: its flags (``--at``, ``--every``, ``--prompt``,
``--at-ask``, ``--answer``) as `BranchPoint` values (`branch_points`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from reroll_contracts.errors import ConfigError, RunFolderError

from reroll.rollout.checkpoint import At
from reroll.runfolder.asks import ASKS_FILE, load_asks
from reroll.runfolder.run import load_run_folder


@dataclass(frozen=True)
class BranchPoint:
    """Where a group of branches starts: a checkpoint, and what they are given there."""

    at: str
    """The checkpoint (see `reroll.rollout.checkpoint`)."""
    prompt: str | None = None
    """The prompt of the turn the cut starts, instead of the recorded one
    (`reroll.rollout.checkpoint.Checkpoint.with_prompt`)."""
    answer: str | None = None
    """The answer to the recorded ask_user question asked at the cut (``--at-ask``)."""
    label: str = ""
    """The prefix of its children's folders (``at10``, ``prompt0``, ``option0``, ``answer0``); ""
    for a tree of one point."""


def branch_points(
    run_folder: Path,
    at: At | Sequence[At] | None = None,
    *,
    every: int | None = None,
    prompts: Sequence[str] = (),
    at_ask: int | None = None,
    answers: Sequence[str] = (),
) -> list[BranchPoint]:
    """The branch points that `at`, `every`, `prompts`, `at_ask` and `answers` name (``reroll
    branch``'s flags).

    Args:
        run_folder: the recorded run (its length bounds `every`, its asks.json `at_ask`).
        at: one checkpoint, several (a sequence, or a text with commas: ``10,20,30``); a value
            curve when several.
        every: instead of `at`: the cut points 0, N, 2N, … up to the run's recorded exchanges.
        prompts: one point per prompt, at the one checkpoint `at` names.
        at_ask: instead of `at`: the run's ask_user question N (0-based, `reroll.runfolder.asks`): one
            point per option it offered (or per answer of `answers`), cut where it was asked.
        answers: with `at_ask`: the answers to give instead of the question's options.

    Raises:
        ConfigError: not exactly one of `at`, `every`, `at_ask`; `every` below 1; `prompts` with
            several checkpoints or with `at_ask`; `answers` without `at_ask`; a question without
            options and no `answers`.
        RunFolderError: the run folder cannot be loaded (with `every`), or has no question `at_ask`.
    """
    if sum(given is not None for given in (at, every, at_ask)) != 1:
        raise ConfigError(
            "branch needs a checkpoint: --at K (or K1,K2,…), --every N or --at-ask N, one of them"
        )
    if answers and at_ask is None:
        raise ConfigError("--answer needs --at-ask N (the question it answers)")
    if at_ask is not None:
        if prompts:
            raise ConfigError("--prompt and --at-ask cannot be combined (--answer gives the answers)")
        return _ask_points(run_folder, at_ask, answers)
    if every is not None:
        if every < 1:
            raise ConfigError(f"--every {every}: the step between cut points must be at least 1")
        recorded = len(load_run_folder(run_folder).exchanges)
        cuts: list[str] = [str(step) for step in range(0, recorded + 1, every)]
    elif isinstance(at, str):
        cuts = [part.strip() for part in at.split(",")]
    elif isinstance(at, Sequence):
        cuts = [str(point) for point in at]
    else:
        cuts = [str(at)]
    if any(not cut for cut in cuts) or len(set(cuts)) != len(cuts):
        raise ConfigError(f"--at {at}: expected distinct checkpoints separated by commas")
    if prompts:
        if len(cuts) != 1:
            raise ConfigError(f"--prompt needs one checkpoint (--at TURN:0), not {len(cuts)}")
        return [BranchPoint(cuts[0], prompt, label=f"prompt{index}") for index, prompt in enumerate(prompts)]
    if len(cuts) == 1:
        return [BranchPoint(cuts[0])]
    return [BranchPoint(cut, label=f"at{cut.replace(':', '-')}") for cut in cuts]


def _ask_points(run_folder: Path, number: int, answers: Sequence[str]) -> list[BranchPoint]:
    """One point per answer to question `number` of `run_folder`: `answers`, else its options.

    Raises:
        RunFolderError: the run has no such question.
        ConfigError: it offered no options and `answers` is empty.
    """
    asks = load_asks(run_folder)
    if not asks:
        raise RunFolderError(
            f"{run_folder}: --at-ask {number}: the run asked no ask_user question (no {ASKS_FILE}); "
            "record it with --ask-user and an agent that asks"
        )
    if not 0 <= number < len(asks):
        raise RunFolderError(
            f"{run_folder}: --at-ask {number}: the run asked {len(asks)} question(s), so N must be "
            f"within 0..{len(asks) - 1}"
        )
    ask = asks[number]
    if answers:
        return [BranchPoint(str(ask.step), answer=text, label=f"answer{j}") for j, text in enumerate(answers)]
    if not ask.options:
        raise ConfigError(
            f"--at-ask {number}: question {ask.question!r} offered no options: give answers (--answer TEXT)"
        )
    return [BranchPoint(str(ask.step), answer=text, label=f"option{j}") for j, text in enumerate(ask.options)]
