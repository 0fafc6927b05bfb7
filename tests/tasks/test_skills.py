"""Skills on the host (`reroll.tasks.skills`): loading a skills folder, the nudge's three levels,
the skills an agent opened, the Dockerfile lines a no-skill build drops, and `reroll task check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reroll.tasks.check import resolved
from reroll.tasks.skills import load_skills, nudge_level, skills_opened, with_nudge
from reroll.tasks.task import load_task
from reroll_contracts.errors import TaskError
from reroll_contracts.trajectory import Exchange

TASK = Path(__file__).resolve().parents[1] / "rollout" / "skills_task"
SKILLS = TASK / "environment" / "skills"


def test_a_skills_folder_loads_with_names_descriptions_and_digests(tmp_path: Path) -> None:
    (skill,) = load_skills(SKILLS)
    assert (skill.name, skill.description) == ("greeting", "The word to write into answer.txt.")
    assert "marmalade" in skill.text and len(skill.digest) == 64
    copy = tmp_path / "greeting"
    copy.mkdir()
    (copy / "SKILL.md").write_text(skill.text + "changed\n")
    assert load_skills(tmp_path)[0].digest != skill.digest


def test_a_skill_folder_without_skill_md_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "README.md").write_text("no front matter")
    with pytest.raises(TaskError, match=r"broken/ has no SKILL\.md"):
        load_skills(tmp_path)
    with pytest.raises(TaskError, match="not found"):
        load_skills(tmp_path / "missing")


@pytest.mark.parametrize(
    ("level", "present", "absent"),
    [
        ("name", ["Skills available at ~/.claude/skills: greeting. Read them"], ["The word to write"]),
        ("description", ["- **greeting**: The word to write into answer.txt."], ["The word is marmalade"]),
        ("full", ['<skill name="greeting">', "The word is marmalade."], ["Skills available"]),
    ],
)
def test_the_nudge_puts_its_level_of_the_skills_before_the_prompt(
    level: str, present: list[str], absent: list[str]
) -> None:
    prompt = with_nudge("Do the task.", load_skills(SKILLS), level, "~/.claude/skills")  # type: ignore[arg-type]
    assert prompt.endswith("\n\nDo the task.")
    assert all(text in prompt for text in present) and not any(text in prompt for text in absent)


def test_the_nudge_level_comes_from_reroll_s_variable_then_benchflow_s() -> None:
    assert nudge_level({}) is None
    assert nudge_level({"BENCHFLOW_SKILL_NUDGE": "name"}) == "name"
    assert nudge_level({"REROLL_SKILL_NUDGE": "full", "BENCHFLOW_SKILL_NUDGE": "name"}) == "full"
    with pytest.raises(TaskError, match="REROLL_SKILL_NUDGE='all'"):
        nudge_level({"REROLL_SKILL_NUDGE": "all"})


def _answer(body: dict[str, Any]) -> Exchange:
    return Exchange.model_validate(
        {
            "request": {"timestamp": "t", "method": "POST", "path": "/v1/messages", "body": {}},
            "response": {"timestamp": "t", "status_code": 200, "body": body},
        }
    )


def test_the_skills_opened_are_read_from_the_tool_calls() -> None:
    read = _answer(
        {
            "content": [
                {
                    "type": "tool_use",
                    "name": "Read",
                    "input": {"file_path": "/h/.claude/skills/greeting/SKILL.md"},
                }
            ]
        }
    )
    invoked = _answer({"content": [{"type": "tool_use", "name": "Skill", "input": {"skill": "other"}}]})
    shell = _answer(
        {"output": [{"type": "function_call", "arguments": '{"cmd": "cat ~/.agents/skills/third/x.md"}'}]}
    )
    unrelated = _answer({"content": [{"type": "text", "text": "greeting other third"}]})
    names = ["greeting", "other", "third", "unused"]
    assert skills_opened([read, invoked, shell, unrelated], names) == ["greeting", "other", "third"]
    assert skills_opened([unrelated], names) == []


def test_task_check_shows_the_skills_found() -> None:
    rows = dict(resolved(load_task(TASK)))
    assert rows["skills"] == "environment/skills: greeting (The word to write into answer.txt.)"
    broken = dict(
        resolved(load_task(Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello-file"))
    )
    assert broken["skills"] == "none"
