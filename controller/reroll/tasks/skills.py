"""Skills on the host: the folders that hold them, their digests, the prompt nudge, the skills an
agent opened (pure: no sandbox).

A skills folder holds one folder per skill, each with a ``SKILL.md`` whose YAML front matter
names and describes it (Anthropic's Agent Skills format, as SkillsBench tasks ship them in
``environment/skills/<name>/SKILL.md``)::

    ---
    name: yaml-report
    description: Summarise a YAML inventory into a report.
    ---
    # The body: instructions, read by the agent when it uses the skill.

The nudge (``$REROLL_SKILL_NUDGE``, or BenchFlow's ``$BENCHFLOW_SKILL_NUDGE``) puts their names,
names and descriptions, or whole SKILL.md files before the prompt, in the words BenchFlow's
``_resolve_prompts`` used (removed from BenchFlow in its #908; reroll keeps it opt-in).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from reroll_contracts.errors import TaskError
from reroll_contracts.trajectory import Exchange

from reroll.tasks.task import SKILLS_FOLDER
from reroll.trials.config import SkillNudge

SKILL_FILE = "SKILL.md"
NUDGE_VARIABLES = ("REROLL_SKILL_NUDGE", "BENCHFLOW_SKILL_NUDGE")
"""The variables that ask for a nudge, reroll's first."""
MAX_SKILL_FILE_BYTES = 256 * 1024
"""The most of one SKILL.md read (for its front matter and a ``full`` nudge)."""


class Skill(BaseModel):
    """One skill of a skills folder."""

    name: str
    """Its folder's name (what the agent's native discovery and `skills_opened` go by)."""
    description: str
    """The front matter's ``description`` ("" when it has none)."""
    text: str
    """The whole SKILL.md (at most `MAX_SKILL_FILE_BYTES`)."""
    digest: str
    """sha256 of its files (`tree_digest`)."""


def bundled_skills_dir(task_path: Path) -> Path:
    """Where a task ships its skills: ``environment/skills`` (SkillsBench's, BenchFlow's)."""
    return task_path / "environment" / SKILLS_FOLDER


def load_skills(folder: Path) -> list[Skill]:
    """The skills in `folder`, by name.

    Raises:
        TaskError: `folder` is not a folder, holds no skill, or a folder in it has no SKILL.md
            (each names the folder).
    """
    if not folder.is_dir():
        raise TaskError(f"skills folder {folder}: not found (or not a folder)")
    skills = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        skill_file = child / SKILL_FILE
        if not skill_file.is_file():
            raise TaskError(
                f"skills folder {folder}: {child.name}/ has no {SKILL_FILE} (every skill is a folder "
                f"<name>/{SKILL_FILE} with a name and a description in its front matter)"
            )
        with open(skill_file, "rb") as file:
            text = file.read(MAX_SKILL_FILE_BYTES).decode(errors="replace")
        files = {
            str(path.relative_to(child)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in child.rglob("*")
            if path.is_file() and not path.is_symlink()
        }
        skills.append(
            Skill(name=child.name, description=description_of(text), text=text, digest=tree_digest(files))
        )
    if not skills:
        raise TaskError(f"skills folder {folder}: holds no skill (<name>/{SKILL_FILE})")
    return skills


def tree_digest(files: Mapping[str, str]) -> str:
    """One sha256 over a skill's files: ``{path relative to the skill folder: sha256 hex}`` (the
    shape of `reroll.sandbox.base.Sandbox.manifest`), in path order."""
    return hashlib.sha256(json.dumps(dict(sorted(files.items()))).encode()).hexdigest()


def description_of(text: str) -> str:
    """The ``description`` of a SKILL.md's YAML front matter; "" when it has none or it is not YAML."""
    if not text.startswith("---"):
        return ""
    parts = text.split("---", 2)
    try:
        front = yaml.safe_load(parts[1]) if len(parts) == 3 else None
    except yaml.YAMLError:
        return ""
    value = front.get("description") if isinstance(front, dict) else None
    return " ".join(str(value).split()) if value else ""


def nudge_level(environ: Mapping[str, str] = os.environ) -> SkillNudge | None:
    """The nudge asked for by `NUDGE_VARIABLES` (the first set wins); None when neither is set.

    Raises:
        TaskError: the value is not one of name, description, full.
    """
    for variable in NUDGE_VARIABLES:
        if value := environ.get(variable, "").strip():
            if value not in get_args(SkillNudge):
                raise TaskError(f"{variable}={value!r}: expected one of {', '.join(get_args(SkillNudge))}")
            return value  # type: ignore[return-value]  # checked just above
    return None


def with_nudge(prompt: str, skills: list[Skill], level: SkillNudge, where: str) -> str:
    """`prompt` with the `skills` (mounted at `where`, e.g. ``~/.claude/skills``) put before it:
    their names (``name``), names and descriptions (``description``), or each SKILL.md whole in a
    ``<skill name="…">`` block (``full``). `prompt` unchanged when there is no skill."""
    if not skills:
        return prompt
    if level == "name":
        names = ", ".join(skill.name for skill in skills)
        nudge = f"Skills available at {where}: {names}. Read them before starting."
    elif level == "description":
        lines = [f"Skills available at {where}:\n", *(f"- **{s.name}**: {s.description}" for s in skills)]
        nudge = "\n".join([*lines, "\nRead the relevant skills before starting."])
    else:
        nudge = "\n\n".join(f'<skill name="{skill.name}">\n{skill.text}\n</skill>' for skill in skills)
    return f"{nudge}\n\n{prompt}"


def skills_opened(exchanges: Iterable[Exchange], names: Iterable[str]) -> list[str]:
    """The skills of `names` the agent opened in `exchanges`: those a tool call of a response
    names by path (``…/<name>/SKILL.md``, ``skills/<name>/…``) or invokes (Claude Code's ``Skill``
    tool: ``{"skill": "<name>"}``), sorted. Tool calls are read from the responses' bodies in
    every API format (their arguments as text or as objects)."""
    wanted = set(names)
    found: set[str] = set()
    patterns = {
        name: re.compile(rf"(?:skills/{re.escape(name)}(?:/|\b)|/{re.escape(name)}/{SKILL_FILE})")
        for name in wanted
    }
    for exchange in exchanges:
        for text in _strings(exchange.response.body if exchange.response else None):
            found |= {name for name, pattern in patterns.items() if pattern.search(text)}
            if text in wanted and text not in found:
                found |= _invoked(exchange.response.body if exchange.response else None, text)
    return sorted(found)


def _strings(value: Any) -> Iterable[str]:
    """Every string in a JSON value (a tool call's arguments are one, or an object of them)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _invoked(body: Any, name: str) -> set[str]:
    """{`name`} when `body` holds a tool call of Claude Code's ``Skill`` tool with ``skill: name``."""
    if isinstance(body, dict):
        if body.get("name") == "Skill" and isinstance(body.get("input"), dict):
            return {name} if body["input"].get("skill") == name else set()
        return set().union(*(_invoked(item, name) for item in body.values()))
    if isinstance(body, list):
        return set().union(*(_invoked(item, name) for item in body))
    return set()
