"""BenchFlow's ``reward-kit`` and ``ors-episode`` verifier strategies, as a task declares them.

`checked_strategy` checks either at load (`reroll.tasks.task`), so ``reroll task check`` and a
run refuse the same tasks; the verifiers are `reroll.rollout.verify.reward_kit` and
`reroll.rollout.verify.ors_episode`.

**reward-kit.**
A strategy in ``verifier/verifier.md`` (BenchFlow 0.7.x's ``benchflow.task.verifier_reward_kit``
and ``benchflow.rewards.rubric_config.criteria_aggregate_policy_from_rubric``)::

    verifier:
      default_strategy: rewardkit
      strategies:
        rewardkit: {type: reward-kit, root: rewards, entrypoint: reward.py,
                    criteria: rewards/criteria.toml}

``root`` (required) is a folder of the verifier folder, ``entrypoint`` (default ``reward.py``)
the runner inside it, ``criteria`` (optional) a rubric file relative to the verifier folder
(TOML, or JSON when it ends in ``.json``) whose ``[[criterion]]`` names and weights and
``[scoring]`` method become the strict aggregate policy of the runner's ``reward.json``
(`criteria_policy`). Every path must be relative, without ``..``. `reward_kit_strategy` reads
and checks them.

**ors-episode.** ``inputs`` (required): a non-empty list of paths (relative to the run folder, or
absolute in the sandbox), none holding ``..``; ``format`` (optional): json, jsonl or auto
(`ors_inputs`).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from reroll_contracts.errors import TaskError

from reroll.tasks.rubric import DOCUMENT, agent_judge_fields

DEFAULT_ENTRYPOINT = "reward.py"
"""The runner a strategy without ``entrypoint`` runs, in its ``root``."""
CRITERIA_METHODS = ("weighted_mean", "weighted_sum", "all_pass", "any_pass", "threshold")
"""The ``[scoring] aggregation`` (or ``method``) values a criteria file may name (``mean`` reads
as ``weighted_mean``), BenchFlow's."""
CRITERION_TYPES = ("binary", "likert", "numeric")
ORS_FORMATS = ("json", "jsonl", "auto")


def checked_strategy(kind: str, options: dict[str, Any], verifier_dir: Path) -> dict[str, Any] | None:
    """Check the options of a ``reward-kit`` (`reward_kit_strategy`), ``ors-episode``
    (`ors_inputs`) or ``agent-judge`` (its BenchFlow fields: `reroll.tasks.rubric.agent_judge_fields`)
    verifier, in whichever file the task declares it; any other `kind` is not checked here.

    Returns:
        The reward-kit criteria's aggregate policy, which replaces verifier.md's
        ``outputs.aggregate_policy`` (BenchFlow's rule); None: no criteria, or another kind.

    Raises:
        TaskError: as those functions.
    """
    if kind == "ors-episode":
        ors_inputs(options, str(verifier_dir / DOCUMENT))
    if kind == "agent-judge":
        agent_judge_fields(options, verifier_dir, f"{verifier_dir.parent}: agent-judge verifier.options")
    return reward_kit_strategy(options, verifier_dir).policy if kind == "reward-kit" else None


def ors_inputs(options: dict[str, Any], where: str) -> list[str]:
    """An ``ors-episode`` strategy's ``inputs`` (with its ``format`` checked), as BenchFlow's
    parser requires them.

    Raises:
        TaskError: ``inputs`` is not a non-empty list of non-empty strings, one holds ``..``, or
            ``format`` is not json, jsonl or auto (the message names `where`).
    """
    inputs = options.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) and i for i in inputs):
        raise TaskError(f"{where}: an ors-episode strategy's inputs must be a non-empty list of strings")
    for declared in inputs:
        if ".." in PurePosixPath(declared).parts:
            raise TaskError(f"{where}: ors-episode input {declared!r} must stay inside the run's evidence")
    if options.get("format", "auto") not in ORS_FORMATS:
        raise TaskError(f"{where}: an ors-episode strategy's format must be json, jsonl or auto")
    return list(inputs)


@dataclass(frozen=True)
class RewardKitStrategy:
    """A checked ``reward-kit`` strategy: its paths relative to the verifier folder."""

    root: PurePosixPath
    entrypoint: PurePosixPath
    """Relative to `root`."""
    criteria: PurePosixPath | None
    """Relative to the verifier folder; None: no criteria declared."""
    policy: dict[str, Any] | None
    """`criteria_policy` of the criteria file; None without one."""

    @property
    def runner(self) -> PurePosixPath:
        """The runner's path relative to the verifier folder (``root/entrypoint``)."""
        return self.root / self.entrypoint


def reward_kit_strategy(options: dict[str, Any], verifier_dir: Path) -> RewardKitStrategy:
    """The ``reward-kit`` strategy `options` declare (``root``, ``entrypoint``, ``criteria``;
    others are kept in the manifest and otherwise ignored, as BenchFlow does).

    Raises:
        TaskError: ``root`` is missing, a path is not a non-empty relative string without ``..``,
            the runner or the criteria file is not a file of `verifier_dir`, or the criteria file
            is invalid (`criteria_policy`); the message names the field or the file.
    """
    where = f"{verifier_dir / DOCUMENT}: reward-kit strategy"
    root = _relative(options.get("root"), f"{where}: root", required=True)
    entrypoint = _relative(
        options.get("entrypoint", DEFAULT_ENTRYPOINT), f"{where}: entrypoint", required=True
    )
    criteria = _relative(options.get("criteria"), f"{where}: criteria", required=False)
    assert root is not None and entrypoint is not None  # required: _relative raised otherwise
    runner = verifier_dir / root / entrypoint
    if not runner.is_file():
        raise TaskError(f"{where}: the runner {runner} (root/entrypoint) is not a file")
    policy = None
    if criteria is not None:
        if not (verifier_dir / criteria).is_file():
            raise TaskError(f"{where}: the criteria file {verifier_dir / criteria} is missing")
        policy = criteria_policy(verifier_dir / criteria)
    return RewardKitStrategy(root=root, entrypoint=entrypoint, criteria=criteria, policy=policy)


def _relative(value: Any, field: str, *, required: bool) -> PurePosixPath | None:
    """`value` as a relative path; None when it is None and not `required`.

    Raises:
        TaskError: it is not a non-empty string, or absolute, or holds ``..`` (names `field`).
    """
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise TaskError(f"{field} must be a non-empty string, not {value!r}")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise TaskError(f"{field} {value!r} must be a relative path without '..'")
    return path


def criteria_policy(path: Path) -> dict[str, Any]:
    """The strict aggregate policy a criteria file declares, as BenchFlow derives it:
    ``{"field": "reward", "method", "threshold", "criteria": [ids], "weights": {id: weight}}``.
    A criterion's id is its ``name``, else ``id``, else ``title``, else the first 40 characters
    of its ``description`` (or ``match_criteria``); ``weight`` defaults to 1.0; ``[scoring]
    aggregation`` (or ``method``) to ``weighted_mean``, ``threshold`` to 0.7.

    Raises:
        TaskError: the file does not load, declares no criteria, names an unsupported method or
            criterion type, a threshold outside [0, 1], an empty or duplicate id, or a weight that
            is not a finite number of at least 0 (the message names the file).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TaskError(f"reward-kit criteria file {path}: cannot load it: {exc}") from exc
    raw = data.get("criterion", data.get("criteria", [])) if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw or not all(isinstance(item, dict) for item in raw):
        raise TaskError(f"reward-kit criteria file {path} declares no criteria ([[criterion]] tables)")
    scoring = data.get("scoring", {}) if isinstance(data.get("scoring", {}), dict) else {}
    method = scoring.get("aggregation", scoring.get("method", "weighted_mean"))
    method = "weighted_mean" if method == "mean" else method
    if method not in CRITERIA_METHODS:
        raise TaskError(f"reward-kit criteria file {path} uses unsupported scoring method {method!r}")
    threshold = _finite(scoring.get("threshold", 0.7))
    if threshold is None or not 0.0 <= threshold <= 1.0:
        raise TaskError(f"reward-kit criteria file {path} has invalid scoring threshold")
    weights: dict[str, float] = {}
    for item in raw:
        description = item.get("description") or item.get("match_criteria") or item.get("title") or ""
        name = str(item.get("name") or item.get("id") or item.get("title") or str(description)[:40]).strip()
        if not name:
            raise TaskError(f"reward-kit criteria file {path} has a criterion with an empty id")
        if name in weights:
            raise TaskError(f"reward-kit criteria file {path} has duplicate id {name!r}")
        if item.get("type", "binary") not in CRITERION_TYPES:
            raise TaskError(
                f"reward-kit criteria file {path}: criterion {name!r} has unsupported type {item['type']!r}"
            )
        weight = _finite(item.get("weight", 1.0))
        if weight is None or weight < 0:
            raise TaskError(f"reward-kit criteria file {path} has invalid weight for {name!r}")
        weights[name] = weight
    return {
        "field": "reward",
        "method": method,
        "threshold": threshold,
        "criteria": list(weights),
        "weights": weights,
    }


def _finite(value: Any) -> float | None:
    """`value` as a finite float (``float(value)``, as BenchFlow reads it); None when it is not one."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
