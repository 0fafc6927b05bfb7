"""LLM-judge rubrics and verifier strategy declarations, in BenchFlow's files.

Where a task declares how it is scored (seeds/concepts.txt, "Verifier file map"; BenchFlow's
``docs/llm-judge.md`` and ``benchflow.task.verifier_document``):

- native: ``verifier/verifier.md``, whose YAML front matter names the strategies and the
  default one (``verifier: {default_strategy: judge, strategies: {judge: {type: llm-judge,
  model: ..., rubric: rubrics/verifier.toml}}}``); `document_strategy` reads it;
- legacy: ``[verifier] type = "llm-judge"`` in task.toml, the judge's settings in
  ``[verifier.judge]`` (``model``, ``rubric_path`` relative to the task folder, default
  ``tests/rubric.toml``); `reroll.tasks.compat.normalise` moves them to ``verifier.options``;
- reroll's own: ``verifier: {type: llm-judge, options: {...}}`` in task.md or task.toml.

A rubric (`Rubric`) is ``verifier/rubrics/verifier.toml`` (with a human-readable
``verifier/rubrics/verifier.md`` beside it, shown to the judge), ``tests/rubric.toml``, or a
Harvey LAB style ``rubric.json`` (``{"title", "criteria": [{"id", "title", "match_criteria"}]}``);
`find_rubric` looks in that order. Criteria are BenchFlow's: ``binary`` (the judge answers
``{"verdict": "pass" | "fail", "reasoning"}``), ``likert`` (``{"score": 1..points}``) and
``numeric`` (``{"score": min..max}``), each normalised to [0, 1] and weighted; ``[scoring]
aggregation`` is ``weighted_mean`` (default), ``all_pass``, ``any_pass`` or ``threshold``.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from reroll_contracts.errors import TaskError
from reroll_contracts.graded import AggregatePolicy
from reroll_contracts.reward import Space

DOCUMENT = "verifier.md"
"""The native strategy declaration, in the verifier folder."""
RUBRICS = ("rubrics/verifier.toml", "rubrics/verifier.json", "rubric.toml", "rubric.json")
"""Where a rubric is looked for, relative to the verifier folder, in order."""
RUBRIC_NOTES = "rubrics/verifier.md"
"""The human-readable rubric beside ``rubrics/verifier.toml``."""
STRATEGY_TYPES = {
    "script": "test-script",
    "llm-judge": "llm-judge",
    "agent-judge": "agent-judge",
    "reward-kit": "reward-kit",
    "ors-episode": "ors-episode",
}
"""BenchFlow's strategy ``type`` → reroll's ``verifier.type``."""
SCRIPT_COMMANDS = ("./test.sh", "test.sh", "bash test.sh", "sh test.sh", "bash ./test.sh")
"""A ``script`` strategy's ``command`` values that mean the folder's test.sh (run as a task
without verifier.md runs it); any other becomes ``verifier.command``."""
SCRIPT_SUFFIXES = (".js", ".mjs", ".py", ".rb", ".sh", ".ts")
"""A ``command`` word ending in one of these (or holding a ``/``) names a file of the verifier
folder, which must exist (BenchFlow's rule for a script strategy's packaged artifacts)."""
ROLE_SECTION = re.compile(r"^##\s+role:([A-Za-z0-9_.-]+)\s*$", re.IGNORECASE | re.MULTILINE)
"""A ``## role:NAME`` heading of verifier.md's body: the prompt of an agent-judge with ``role: NAME``."""
ISOLATIONS = ("verifier-only",)
"""An agent-judge strategy's ``isolation`` values (BenchFlow 0.7.x knows this one)."""
COMMAND_SCRIPT = ".reroll-command.sh"
"""The script reroll writes into the uploaded verifier folder to run ``verifier.command``
(`reroll.rollout.verify.script_verifier`); a task's own file may not have this name."""


class Criterion(BaseModel):
    """One rubric item (BenchFlow's ``[[criterion]]``, or a ``rubric.json`` criterion)."""

    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    """The item's name: ``name``, else ``id``, else ``title`` (the first 40 characters of the
    description when none is given)."""
    description: str = Field(min_length=1)
    """What the judge checks (``description``, or ``match_criteria``)."""
    type: Literal["binary", "likert", "numeric"] = "binary"
    weight: float = Field(default=1.0, ge=0)
    points: int = Field(default=5, ge=2)
    """The likert scale's top (1 to `points`)."""
    min: float = 0.0
    max: float = 100.0
    space: Space = "output"
    """The space the item reads (its reward event's tag)."""
    files: list[str] = []
    """The workspace files the item judges (relative paths); empty: the rubric's, else all."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        data = dict(raw)
        description = data.get("description") or data.get("match_criteria") or data.get("title")
        if description:
            data["description"] = description
        name = data.get("name") or data.get("id") or data.get("title")
        data["name"] = name or str(description or "")[:40]
        return data

    @model_validator(mode="after")
    def _range(self) -> Criterion:
        if self.type == "numeric" and self.max <= self.min:
            raise ValueError(f"criterion {self.name!r}: max ({self.max}) must be above min ({self.min})")
        return self

    def normalise(self, raw: float) -> float:
        """A judge's raw answer in [0, 1]: pass 1 / fail 0, ``(score-1)/(points-1)``, or
        ``(score-min)/(max-min)``, clamped."""
        if self.type == "binary":
            return 1.0 if raw >= 0.5 else 0.0
        low, high = (1.0, float(self.points)) if self.type == "likert" else (self.min, self.max)
        return max(0.0, min(1.0, (raw - low) / (high - low)))


class Scoring(BaseModel):
    """``[scoring]``: how the items make the reward."""

    model_config = ConfigDict(extra="ignore")
    aggregation: Literal["weighted_mean", "all_pass", "any_pass", "threshold"] = "weighted_mean"
    threshold: float = Field(default=0.7, ge=0, le=1)

    def reward(self, criteria: list[Criterion], scores: list[float]) -> float:
        """The reward of `scores` (one per criterion, in [0, 1])."""
        total = sum(c.weight for c in criteria)
        mean = sum(c.weight * s for c, s in zip(criteria, scores, strict=True)) / total if total else 0.0
        if self.aggregation == "all_pass":
            return float(all(s >= 0.5 for s in scores))
        if self.aggregation == "any_pass":
            return float(any(s >= 0.5 for s in scores))
        if self.aggregation == "threshold":
            return float(mean >= self.threshold)
        return mean


class Rubric(BaseModel):
    """A loaded rubric: its criteria, scoring and the judge settings it carries."""

    model_config = ConfigDict(extra="ignore")
    path: Path
    """The file it was loaded from (on the host; it never enters the sandbox)."""
    criteria: list[Criterion] = Field(min_length=1)
    scoring: Scoring = Field(default_factory=Scoring)
    model: str | None = None
    """``[judge] model``: the judge model the rubric names, if any."""
    files: list[str] = []
    """``[judge] files``: the workspace files judged by default (relative paths)."""
    notes: str = ""
    """The human-readable rubric (``rubrics/verifier.md``), or a JSON rubric's ``title``."""


def load_rubric(path: Path) -> Rubric:
    """Load a rubric file: JSON (Harvey LAB style) when it ends in ``.json``, TOML otherwise.

    Raises:
        TaskError: the file cannot be read, does not parse, declares no criterion or an invalid
            one (the message names the file and the cause).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSON and TOML errors are ValueErrors
        raise TaskError(f"{path}: cannot load the rubric: {exc}") from exc
    if not isinstance(data, dict):
        raise TaskError(f"{path}: a rubric must be an object")
    judge = data["judge"] if isinstance(data.get("judge"), dict) else {}
    notes_file = path.parent / Path(RUBRIC_NOTES).name
    notes = str(data.get("title", ""))
    if path.name == "verifier.toml" and notes_file.is_file():
        notes = notes_file.read_text(encoding="utf-8", errors="replace")
    raw = {
        "path": path,
        "criteria": data.get("criterion", data.get("criteria", [])),
        "scoring": data.get("scoring", {}),
        "model": judge.get("model"),
        "files": judge.get("files", []),
        "notes": notes,
    }
    try:
        return Rubric.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(f"{path}: invalid rubric:\n{exc}") from exc


def find_rubric(task_path: Path, verifier_dir: Path, options: dict[str, Any]) -> Path:
    """The rubric file of a judged task: ``options["rubric"]`` (relative to the verifier folder,
    BenchFlow's native field), ``options["rubric_path"]`` (relative to the task folder, the legacy
    ``[verifier.judge]`` field), else the first of `RUBRICS` that exists.

    Raises:
        TaskError: the named file is missing or outside the task, or none of `RUBRICS` exists.
    """
    for key, base in (("rubric", verifier_dir), ("rubric_path", task_path)):
        if (value := options.get(key)) is not None:
            relative = Path(str(value))
            if relative.is_absolute() or ".." in relative.parts:
                raise TaskError(
                    f"{task_path}: verifier {key} {value!r} must be a relative path inside the task"
                )
            if not (base / relative).is_file():
                raise TaskError(f"{task_path}: the rubric {base / relative} (verifier {key}) is missing")
            return base / relative
    for name in RUBRICS:
        if (verifier_dir / name).is_file():
            return verifier_dir / name
    looked = ", ".join(str(verifier_dir / name) for name in RUBRICS)
    raise TaskError(f"{task_path}: an llm-judge task needs a rubric (looked for {looked})")


def document_strategy(verifier_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """The default strategy ``verifier/verifier.md`` declares: ``(verifier.type, options)``;
    None when the folder has no such file.

    Raises:
        TaskError: the file's front matter is not YAML, names no strategy or an unknown default,
            or a type reroll has no verifier for, a script strategy has no command, or an
            agent-judge lacks one of role, isolation and inputs or has an invalid one
            (`agent_judge_fields`); the message names the file.
    """
    path = verifier_dir / DOCUMENT
    if not path.is_file():
        return None
    section = _verifier_section(path)
    strategies = section.get("strategies") if isinstance(section, dict) else None
    if not isinstance(section, dict) or not isinstance(strategies, dict) or not strategies:
        raise TaskError(f"{path}: the front matter declares no verifier.strategies")
    name = section.get("default_strategy") or next(iter(strategies))
    strategy = strategies.get(name)
    if not isinstance(strategy, dict):
        raise TaskError(f"{path}: default_strategy {name!r} is not one of {', '.join(map(str, strategies))}")
    options = {key: value for key, value in strategy.items() if key != "type"}
    kind = strategy.get("type")
    if kind not in STRATEGY_TYPES:
        raise TaskError(
            f"{path}: strategy {name!r} has type {kind!r}; reroll scores {', '.join(STRATEGY_TYPES)}"
        )
    if kind == "script":  # BenchFlow 0.7.x refuses a script strategy without a command
        command = options.pop("command", None)
        if not isinstance(command, str) or not command.strip():
            raise TaskError(
                f"{path}: strategy {name!r}: a script strategy's command must be a non-empty string "
                "(BenchFlow runs no default; write command: ./test.sh to run the folder's test.sh)"
            )
        if command.strip() not in SCRIPT_COMMANDS:
            options["command"] = command
        options.pop("timeout_sec", None)  # BenchFlow's verifier.timeout_sec applies, not this
    if kind == "agent-judge":  # BenchFlow's parser requires these three of a verifier.md strategy
        for key in ("role", "isolation", "inputs"):
            if key not in options:
                raise TaskError(
                    f"{path}: agent-judge strategy {name!r} must declare {key} (BenchFlow requires it)"
                )
        agent_judge_fields(options, verifier_dir, f"{path}: agent-judge strategy {name!r}")
    return STRATEGY_TYPES[kind], options


def agent_judge_fields(options: dict[str, Any], verifier_dir: Path, where: str) -> None:
    """Check the BenchFlow fields an agent-judge's `options` give (each optional here; verifier.md
    requires all three, `document_strategy`): ``role`` names a ``## role:NAME`` section of
    verifier.md's body (`role_sections`), ``isolation`` is ``verifier-only``, ``inputs`` is a
    non-empty list of non-empty paths without ``..``, ``model`` a non-empty string.

    Raises:
        TaskError: a field that is not so (the message starts with `where` and names the field).
    """
    if "role" in options:
        role = options["role"]
        if not isinstance(role, str) or not role:
            raise TaskError(f"{where}: role must be a non-empty string")
        if role not in role_sections(verifier_dir):
            raise TaskError(
                f"{where}: role {role!r} names no '## role:{role}' section of {verifier_dir / DOCUMENT}"
            )
    if "isolation" in options and options["isolation"] not in ISOLATIONS:
        raise TaskError(f"{where}: isolation must be 'verifier-only', not {options['isolation']!r}")
    if "model" in options and (not isinstance(options["model"], str) or not options["model"]):
        raise TaskError(f"{where}: model must be a non-empty string")
    if "inputs" in options:
        inputs = options["inputs"]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) and i for i in inputs):
            raise TaskError(f"{where}: inputs must be a non-empty list of strings")
        for declared in inputs:
            if ".." in PurePosixPath(declared).parts:
                raise TaskError(f"{where}: input {declared!r} must stay inside the run's evidence (no '..')")


def role_sections(verifier_dir: Path) -> dict[str, str]:
    """The ``## role:NAME`` sections of verifier.md's body: NAME → the text up to the next such
    heading (stripped), as BenchFlow reads a verifier-scoped judge's role prompts; {} without the file."""
    body = document_body(verifier_dir)
    headings = list(ROLE_SECTION.finditer(body))
    ends = [heading.start() for heading in headings[1:]] + [len(body)] * bool(headings)
    return {
        heading.group(1): body[heading.end() : end].strip()
        for heading, end in zip(headings, ends, strict=True)
    }


def command_files(command: str, verifier_dir: Path) -> list[Path]:
    """The files of `verifier_dir` that a script strategy's `command` runs or reads: every word
    that is a relative path holding a ``/`` or ending in one of `SCRIPT_SUFFIXES` (options,
    URLs and absolute paths are not), as BenchFlow 0.7.11 finds a command's packaged artifacts.

    Raises:
        TaskError: the command does not split into words as a shell would, is empty, its first
            word is an absolute path or leaves the folder (``..``), it names no such file, or
            one it names is missing or leaves the folder (the message names the command).
    """
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise TaskError(f"verifier command {command!r} does not parse as a shell command: {exc}") from exc
    if not words:
        raise TaskError("verifier command is empty")
    first = PurePosixPath(words[0])
    if first.is_absolute() or ".." in first.parts:
        raise TaskError(
            f"verifier command {command!r}: {words[0]!r} must be relative to the verifier folder "
            "(the command runs there)"
        )
    files: list[Path] = []
    for word in words:
        if not word or word.startswith("-") or "://" in word or any(c.isspace() for c in word):
            continue
        relative = PurePosixPath(word)
        if relative.is_absolute() or ("/" not in word and relative.suffix not in SCRIPT_SUFFIXES):
            continue
        if ".." in relative.parts or not (verifier_dir / relative).is_file():
            raise TaskError(
                f"verifier command {command!r} names {word!r}, which is not a file of the verifier "
                f"folder {verifier_dir}"
            )
        files.append(verifier_dir / relative)
    if not files:
        raise TaskError(
            f"verifier command {command!r} names no file of the verifier folder (a script such as "
            f"grade.py or ./run.sh, or a path holding '/'), as BenchFlow requires"
        )
    return files


def document_aggregate_policy(verifier_dir: Path) -> dict[str, Any]:
    """The ``verifier.outputs.aggregate_policy`` of ``verifier/verifier.md`` (how a graded
    reward.json's items make one reward, `reroll_contracts.graded`); empty: the file or the
    policy is missing.

    Raises:
        TaskError: invalid front matter, or ``outputs`` / the policy is not a mapping or has a
            field of the wrong type (the message names the file).
    """
    path = verifier_dir / DOCUMENT
    if not path.is_file():
        return {}
    section = _verifier_section(path)
    outputs = section.get("outputs") if isinstance(section, dict) else None
    policy = outputs.get("aggregate_policy") if isinstance(outputs, dict) else None
    if outputs is not None and not isinstance(outputs, dict):
        raise TaskError(f"{path}: verifier.outputs must be a mapping")
    if not policy:
        return {}
    try:
        AggregatePolicy.parse(policy, "verifier.outputs.aggregate_policy")
    except ValueError as exc:
        raise TaskError(f"{path}: {exc}") from exc
    return dict(policy)


def checked_policy(policy: dict[str, Any]) -> dict[str, Any]:
    """`policy` (``verifier.aggregate_policy``) once it parses (`AggregatePolicy.parse`).

    Raises:
        ValueError: it does not (the message names the field).
    """
    if policy:
        AggregatePolicy.parse(policy, "verifier.aggregate_policy")
    return policy


PolicyField = Annotated[dict[str, Any], AfterValidator(checked_policy)]
"""``verifier.aggregate_policy``'s type: a mapping that parses as an `AggregatePolicy`."""


def task_policy(policy: dict[str, Any]) -> AggregatePolicy | None:
    """A task's ``verifier.aggregate_policy`` parsed; None when it declares none."""
    return AggregatePolicy.parse(policy, "verifier.aggregate_policy") if policy else None


def _verifier_section(path: Path) -> Any:
    """The ``verifier`` mapping of a verifier.md's front matter (None without one).

    Raises:
        TaskError: the front matter is not YAML (the message names the file).
    """
    return document_front_matter(path).get("verifier")


def document_section(verifier_dir: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(default strategy's name, its fields, the whole front matter)`` of the folder's
    verifier.md: what a verifier that reports its strategy (a reward-kit manifest) names; ``("",
    {}, {})`` without the file.

    Raises:
        TaskError: the front matter is not YAML (the message names the file).
    """
    path = verifier_dir / DOCUMENT
    front = document_front_matter(path) if path.is_file() else {}
    section = front.get("verifier")
    strategies = section.get("strategies") if isinstance(section, dict) else None
    if not isinstance(section, dict) or not isinstance(strategies, dict) or not strategies:
        return "", {}, front
    name = str(section.get("default_strategy") or next(iter(strategies)))
    strategy = strategies.get(name)
    return name, dict(strategy) if isinstance(strategy, dict) else {}, front


def document_front_matter(path: Path) -> dict[str, Any]:
    """The YAML front matter of the verifier.md at `path` ({} without one, or when it is not a
    mapping).

    Raises:
        TaskError: the front matter is not YAML (the message names the file).
    """
    head, _ = _split_document(path)
    front: Any = {}
    if head is not None:
        try:
            front = yaml.safe_load(head) or {}
        except yaml.YAMLError as exc:
            raise TaskError(f"{path}: invalid YAML front matter: {exc}") from exc
    return front if isinstance(front, dict) else {}


def document_body(verifier_dir: Path) -> str:
    """The text of ``verifier/verifier.md`` after its front matter (its "verifier intent": what
    an agent judge is told to check, `reroll.rollout.verify.agent_judge`); "" without the file."""
    path = verifier_dir / DOCUMENT
    return _split_document(path)[1].strip() if path.is_file() else ""


def _split_document(path: Path) -> tuple[str | None, str]:
    """``(front matter, body)`` of a Markdown file with YAML front matter between ``---`` lines;
    the front matter is None when the file has none."""
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
    if not text.startswith("---"):
        return None, text
    head, _, body = text[3:].partition("\n---")
    return head, body.partition("\n")[2]
