"""The ``ors-episode`` verifier: the terminal reward of ORS reward records a run left.

BenchFlow's ``ors-episode`` strategy (0.7.x: ``benchflow.task.verifier_core.Verifier.
_verify_ors_episode``, ``benchflow.task.verifier_ors_episode``) runs nothing: it reads the Open
Reward Standard evidence its ``inputs`` name and takes the episode's terminal reward::

    verifier:
      default_strategy: ors
      strategies:
        ors: {type: ors-episode, inputs: [/logs/artifacts/episode.jsonl]}

An input is a path relative to the run folder (``trajectory/ors-rewards.jsonl``), or an absolute
path: one under ``/logs`` is looked for in the run folder first (``/logs/verifier/x`` →
``verifier/x``), any other (or one the run folder lacks) is read from the sandbox once the
agent's processes are killed. A file ending in ``.jsonl`` holds one JSON object a line; any other
a JSON object or a list of them (``format`` is read and, as in BenchFlow, not used). A record is

- an ORS reward response (``reward`` with ``is_valid``, or with a ``metadata`` holding
  ``items``, ``events`` or ``space``): its ``reward`` is the headline, ``metadata.items`` items,
  ``metadata.events`` events; ``is_valid: false`` or a ``metadata.error`` is a verifier error;
- an episode (``events``, maybe ``reward`` and ``items``);
- otherwise one event: ``reward``, ``type`` (default ``terminal``), ``source`` (default the
  strategy's name), ``step``, ``space`` (default ``output``), ``granularity`` (default
  ``terminal``).

Without a response's or an episode's ``reward``, the terminal events (``type`` or
``granularity`` ``terminal``) give it; two different terminal rewards are a verifier error, none
too. Every reward must be a finite number in [0, 1]. No items: the reward is the one item, named
after the strategy. The verdict's ``verify_result`` holds the items and events (an ORS ``step``
counts tool calls, not the trajectory's exchanges: it goes to the event's ``note``, never its
``step``). The run folder's ``verifier/`` gets ``reward.json`` and ``reward-details.json`` (the
inputs read, their record counts).

Where the records come from is the task's business: reroll runs no ORS environment, so nothing of
reroll writes ``trajectory/ors-rewards.jsonl`` (BenchFlow's ORS runtime does, driving an
OpenReward environment server); a task can name a file its own service writes. A file the agent
can write is evidence the agent can forge: the task, not reroll, must keep it out of its reach.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

from reroll_contracts.errors import VerifierError
from reroll_contracts.reward import Granularity, RewardEvent, Space, VerifyResult

from reroll.rollout.verify.inputs import input_file
from reroll.rollout.verify.script_verifier import quiesce
from reroll.rollout.verify.verifiers import Verdict, VerifyRequest
from reroll.runfolder.paths import VerifierPaths
from reroll.sandbox.base import Sandbox
from reroll.tasks.rubric import document_section
from reroll.tasks.strategies import ors_inputs
from reroll.tasks.task import Task


@dataclass
class Episode:
    """What the records of one verify say, read in order."""

    strategy: str
    reward: float | None = None
    """The last reward response's or episode's ``reward``; None: the terminal events decide."""
    items: dict[str, float] = field(default_factory=dict)
    events: list[tuple[str, RewardEvent]] = field(default_factory=list)
    """``(type, event)`` of every event, in order."""
    error: str | None = None
    space: Space = "output"
    granularity: Granularity = "terminal"


def load_records(path: Path, declared: str) -> list[dict[str, Any]]:
    """The JSON records of the input file `path` (`declared` as the task names it).

    Raises:
        VerifierError: not a regular file, not valid JSON, a record that is not an object, or no
            record at all (the message names `declared`).
    """
    where = f"ors-episode input {declared!r}"
    if not path.is_file():
        raise VerifierError(f"{where} must resolve to a regular file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        if path.suffix == ".jsonl":
            loaded: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
            for number, record in enumerate(loaded, start=1):
                if not isinstance(record, dict):
                    raise VerifierError(f"{where} record {number} must be a JSON object")
        else:
            loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VerifierError(f"{where} is not valid JSON ({exc})") from exc
    records = [loaded] if isinstance(loaded, dict) else loaded
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise VerifierError(f"{where} must be a JSON object or list of objects")
    if not records:
        raise VerifierError(f"{where} has no JSON records")
    return cast(list[dict[str, Any]], records)


def read_episode(records: list[dict[str, Any]], strategy: str) -> VerifyResult:
    """The terminal reward, items and events of `records` (the module docstring).

    Raises:
        VerifierError: an invalid field (named by its path, e.g. ``records[2].reward``), an
            invalid response, conflicting terminal rewards or none.
    """
    episode = Episode(strategy=strategy)
    for index, record in enumerate(records):
        _read_record(episode, record, f"records[{index}]")
    if episode.error is not None:
        raise VerifierError(
            f"ors-episode strategy {strategy!r} produced invalid ORS reward evidence: {episode.error}"
        )
    reward = episode.reward
    if reward is None:
        terminal = [event for kind, event in episode.events if "terminal" in (kind, event.granularity)]
        if len({event.reward for event in terminal}) > 1:
            found = sorted({event.reward for event in terminal})
            raise VerifierError(
                f"ors-episode strategy {strategy!r} has conflicting terminal rewards {found}; "
                "expected one headline"
            )
        if terminal:
            reward, episode.space, episode.granularity = (
                terminal[0].reward,
                terminal[0].space,
                terminal[0].granularity,
            )
    if reward is None:
        raise VerifierError(f"ors-episode strategy {strategy!r} did not include a terminal reward")
    items = episode.items or {strategy: reward}
    return VerifyResult(
        reward=reward,
        items=items,
        events=[event for _, event in episode.events],
        space=episode.space,
        granularity=episode.granularity,
    )


def _is_response(record: Mapping[str, Any]) -> bool:
    """Whether `record` is an ORS reward response (the module docstring)."""
    metadata = record.get("metadata")
    described = isinstance(metadata, dict) and any(key in metadata for key in ("items", "events", "space"))
    return "reward" in record and ("is_valid" in record or described)


def _read_record(episode: Episode, record: Mapping[str, Any], path: str) -> None:
    """Add what `record` says to `episode`. Raises: VerifierError: an invalid field (`path`)."""
    metadata = record.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    if _is_response(record):
        if record.get("is_valid") is False:
            why = metadata.get("error") or "is_valid=false"
            raise VerifierError(
                f"ors-episode strategy {episode.strategy!r} contains an invalid ORS response at {path}: {why}"
            )
        episode.reward = _reward(record.get("reward"), f"{path}.reward")
        episode.items |= _items(metadata.get("items"), f"{path}.metadata.items")
        episode.events += _events(metadata.get("events"), episode.strategy, f"{path}.metadata.events")
        if isinstance(metadata.get("error"), str) and metadata["error"]:
            episode.error = metadata["error"]
        if isinstance(metadata.get("space"), str):
            episode.space = _choice(metadata["space"], get_args(Space), f"{path}.metadata.space")
        if isinstance(metadata.get("granularity"), str):
            episode.granularity = _choice(
                metadata["granularity"], get_args(Granularity), f"{path}.metadata.granularity"
            )
    elif "events" in record:
        episode.events += _events(record.get("events"), episode.strategy, f"{path}.events")
        if "reward" in record:
            episode.reward = _reward(record.get("reward"), f"{path}.reward")
        episode.items |= _items(record.get("items"), f"{path}.items")
        episode.items |= _items(metadata.get("items"), f"{path}.metadata.items")
    else:
        episode.events.append(_event(record, episode.strategy, path))


def _events(value: Any, strategy: str, path: str) -> list[tuple[str, RewardEvent]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise VerifierError(f"{path} must be a list")
    for index, raw in enumerate(value):
        if not isinstance(raw, dict):
            raise VerifierError(f"{path}[{index}] must be an object")
    return [_event(raw, strategy, f"{path}[{index}]") for index, raw in enumerate(value)]


def _event(record: Mapping[str, Any], strategy: str, path: str) -> tuple[str, RewardEvent]:
    """``(type, event)`` of one ORS event record. Raises: VerifierError: an invalid field."""
    reward = _reward(record.get("reward"), f"{path}.reward")
    step = record.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        raise VerifierError(f"{path}.step must be an integer or null")
    event = RewardEvent(
        source=str(record.get("source") or strategy),
        reward=reward,
        space=_choice(record.get("space", "output"), get_args(Space), f"{path}.space"),
        granularity=_choice(
            record.get("granularity", "terminal"), get_args(Granularity), f"{path}.granularity"
        ),
        note="" if step is None else f"ORS step {step}",
    )
    return str(record.get("type") or "terminal"), event


def _reward(value: Any, path: str) -> float:
    """`value` as a reward in [0, 1]. Raises: VerifierError: it is not one (names `path`)."""
    try:
        reward = float(value)
    except (TypeError, ValueError) as exc:
        raise VerifierError(f"{path} must be a numeric reward") from exc
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise VerifierError(f"{path} must be a finite numeric reward between 0.0 and 1.0")
    return reward


def _items(value: Any, path: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise VerifierError(f"{path} must be a mapping")
    return {str(name): _reward(score, f"{path}.{name}") for name, score in value.items()}


def _choice(value: Any, allowed: tuple[str, ...], path: str) -> Any:
    if value not in allowed:
        raise VerifierError(f"{path} must be one of {', '.join(allowed)}, not {value!r}")
    return value


class OrsEpisodeVerifier:
    """The ``ors-episode`` verifier (`reroll.rollout.verify.verifiers.Verifier`). Options: the
    strategy's ``inputs`` and ``format``. The strategy's name (an event's default source, the
    item of a reward without items) is verifier.md's default strategy, else ``ors-episode``."""

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        """Raises: TaskError: invalid ``inputs`` or ``format`` (`reroll.tasks.strategies.ors_inputs`), or
        verifier.md's front matter no longer parses."""
        self.task = task
        self.inputs = ors_inputs(dict(options), f"task {task.name} ({task.path})")
        self.strategy = document_section(task.verifier_dir)[0] or "ors-episode"

    async def prepare(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        """Nothing to record: the records are read after the agent ran."""

    async def verify(self, request: VerifyRequest) -> Verdict:
        """Read the inputs, take their terminal reward (the module docstring). A failure is a
        verdict with status ``error`` (``verifier_error``).

        Raises:
            SandboxError: the sandbox failed or died while its processes were killed.
        """
        started = time.monotonic()
        if not request.soft:
            await quiesce(request.sandbox)
        folder = VerifierPaths(request.output_dir).episode_inputs
        folder.mkdir(parents=True, exist_ok=True)
        try:
            read: list[dict[str, Any]] = []
            records: list[dict[str, Any]] = []
            for index, declared in enumerate(self.inputs):
                path = await input_file(request, declared, folder, index, "ors-episode input")
                loaded = load_records(path, declared)
                records += loaded
                read.append({"path": declared, "local_path": str(path), "records": len(loaded)})
            result = read_episode(records, self.strategy)
        except VerifierError as exc:
            return Verdict(
                rewards={},
                duration_seconds=time.monotonic() - started,
                status="error",
                error_category=exc.error_category,
                error=f"task {self.task.name}: {exc}",
            )
        VerifierPaths(request.output_dir).reward_json.write_bytes(result.to_json())
        details = {
            "source": "ors-episode",
            "strategy": self.strategy,
            "inputs": read,
            "aggregate": {"reward": result.reward, "method": "ors-terminal"},
        }
        VerifierPaths(request.output_dir).details.write_text(json.dumps(details, indent=2) + "\n")
        return Verdict(rewards=result.flat(), duration_seconds=time.monotonic() - started, result=result)
