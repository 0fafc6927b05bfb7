"""Skill modes end to end (`reroll.rollout.skills`): Claude Code and Codex (installed unmodified,
as in tests/agents) under the scripted model, in the `local` sandbox, on a task that ships one
skill (``skills_task/``: ``environment/skills/greeting``, which its Dockerfile also copies into the
image). Each agent's script probes its native skill folder first (lists it, reads every SKILL.md,
tries to write into each skill, looks for the image's copy), then writes the answer; a creator
scene (self-gen) writes a skill instead. One rollout per agent and mode, shared by the tests.

Also: bad skill flags are refused before anything runs, and a no-skill image is built without
the skills (docker).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from reroll.agents import get_agent
from reroll.export.atif import run_to_atif
from reroll.export.verifiers import run_to_record
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.rollout.skills import SceneSkills, creator_skills_dir, select_skills
from reroll.runfolder.run import load_run_folder
from reroll.tasks.task import load_task
from reroll.tasks.variants import with_skills_hidden
from reroll.view import build_site
from reroll_contracts.errors import TaskError
from rich.console import Console

from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

TASK = Path(__file__).resolve().parent / "skills_task"
NATIVE = {"claude-code": "~/.claude/skills", "codex": "~/.agents/skills"}
DISCOVERED = {
    "claude-code": "- greeting: The word to write into answer.txt.",
    "codex": "greeting: The word to write into answer.txt.",
}
"""How each agent lists a skill it discovered natively, in its first request to the model."""


def test_bad_skill_flags_are_refused_with_the_cause(tmp_path: Path) -> None:
    task = load_task(TASK)
    with pytest.raises(TaskError, match=r"--skills-dir .* needs --skills with-skill"):
        select_skills(task, "no-skill", TASK / "environment" / "skills")
    with pytest.raises(TaskError, match="not found"):
        select_skills(task, "with-skill", tmp_path / "missing")
    (tmp_path / "broken").mkdir()
    with pytest.raises(TaskError, match=r"broken/ has no SKILL\.md"):
        select_skills(task, "with-skill", tmp_path)
    bare = load_task(Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello-file")
    with pytest.raises(TaskError, match=r"has no skills .* pass --skills-dir"):
        select_skills(bare, "with-skill", None)
    assert [skill.name for skill in select_skills(task, "self-gen", None).skills] == ["skill-creator"]
    assert (creator_skills_dir() / "skill-creator" / "SKILL.md").is_file()


def test_an_agent_without_native_skills_gets_them_named_in_its_prompt() -> None:
    task = load_task(TASK)
    selection = select_skills(task, "with-skill", None)
    skills = SceneSkills(
        sandbox=None,  # type: ignore[arg-type]  # prompt() needs none
        env={},
        agents={},
        selection=selection,
        nudge=None,
        console=Console(),
        mounted=selection.skills,
        folder="/etc/reroll/skills/mounted",
    )
    claude, mini = get_agent("claude-code"), get_agent("mini-swe-agent")
    assert skills.prompt(claude, "Do it.") == "Do it."  # it discovers them natively
    assert skills.prompt(mini, "Do it.").startswith(
        "Skills available at /etc/reroll/skills/mounted:\n\n- **greeting**: The word to write"
    )
    skills.nudge = "name"
    assert skills.prompt(claude, "Do it.").startswith("Skills available at ~/.claude/skills: greeting.")
    codex = get_agent("codex")
    assert skills.prompt(codex, "Do it.").startswith("Skills available at ~/.agents/skills: greeting.")


@pytest.mark.slow
@pytest.mark.spawns
def test_the_cli_refuses_a_skills_dir_without_with_skill(tmp_path: Path) -> None:
    done = reroll(
        "run", str(TASK), "--agent", "oracle", "--skills", "no-skill", "--skills-dir", str(TASK), cwd=tmp_path
    )  # fmt: skip
    assert done.returncode == 2 and "needs --skills with-skill" in done.stderr + done.stdout
    assert not (tmp_path / "jobs").exists()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """One rollout per (agent, mode), run on demand and kept for the module."""
    return {}


def rollout(
    runs: dict[tuple[str, str], Path], tmp_path_factory: pytest.TempPathFactory, agent: str, mode: str
) -> Path:
    if (agent, mode) not in runs:
        workdir = tmp_path_factory.mktemp(f"{agent}-{mode}")
        done = reroll(
            "run", str(TASK), "--agent", agent, "--model", f"scripted:{TASK}/scripted-model.{agent}.yaml",
            "--skills", mode, "--timeout", "120", "--jobs-dir", "jobs", "--job-name", "skills", cwd=workdir,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        runs[agent, mode] = only_folder(workdir / "jobs" / "skills")
    return runs[agent, mode]


def observations(run: Path, scene: str) -> str:
    """What the agent saw in `scene`: the text of its requests after the probe (its output)."""
    lines = [line for line in trajectory(run) if line["metadata"]["place"]["scene"] == scene]
    return json.dumps(lines[1]["request"]["body"])


def e2e(test: Callable[..., None]) -> Callable[..., None]:
    """An end-to-end test of each agent (slow, spawns processes)."""
    marked: Callable[..., None] = pytest.mark.slow(
        pytest.mark.spawns(pytest.mark.parametrize("agent", ["claude-code", "codex"])(test))
    )
    return marked


@e2e
def test_with_skill_mounts_the_task_s_skills_read_only_at_the_native_path(
    runs: dict[tuple[str, str], Path], tmp_path_factory: pytest.TempPathFactory, agent: str
) -> None:
    run = rollout(runs, tmp_path_factory, agent, "with-skill")
    assert read_json(run / "result.json")["rewards"] == {"reward": 1.0}
    first = json.dumps(trajectory(run)[0]["request"]["body"])
    assert DISCOVERED[agent] in first, "the agent did not list the skill it found natively"
    seen = observations(run, "main")
    assert "SKILLS:\\ngreeting\\n" in seen and "The word is marmalade" in seen
    assert "READ-ONLY\\nIMAGE:" in seen and "\\nWRITABLE\\n" not in seen
    config, result = read_json(run / "config.json"), read_json(run / "result.json")
    assert (config["skill_mode"], config["skill_source"]) == ("with-skill", "task_bundled")
    assert config["effective_skills_dir"] == str(TASK / "environment" / "skills")
    assert list(config["skills"]) == ["greeting"] and len(config["skills"]["greeting"]) == 64
    assert result["skills_opened"] == ["greeting"]
    # the run page and the exports carry the mode and what was opened
    page = build_site(run, run.parent / "site").read_text()
    assert "with-skill (greeting) · opened: greeting" in page
    loaded = load_run_folder(run)
    assert run_to_atif(loaded).extra["reroll"]["skill_mode"] == "with-skill"  # type: ignore[index]
    assert run_to_record(loaded, example_id=0).info["skill_mode"] == "with-skill"


@e2e
def test_no_skill_shows_the_agent_no_skill(
    runs: dict[tuple[str, str], Path], tmp_path_factory: pytest.TempPathFactory, agent: str
) -> None:
    run = rollout(runs, tmp_path_factory, agent, "no-skill")
    assert "greeting: The word" not in json.dumps(trajectory(run)[0]["request"]["body"])
    seen = observations(run, "main")
    assert "marmalade" not in seen and "No such file" in seen
    config, result = read_json(run / "config.json"), read_json(run / "result.json")
    assert (config["skill_mode"], config["skill_source"], config["skills"]) == ("no-skill", "none", {})
    assert result["skills_opened"] is None


@e2e
def test_self_gen_gives_the_creator_only_skill_creator_and_the_solver_only_what_it_wrote(
    runs: dict[tuple[str, str], Path], tmp_path_factory: pytest.TempPathFactory, agent: str
) -> None:
    run = rollout(runs, tmp_path_factory, agent, "self-gen")
    result = read_json(run / "result.json")
    assert result["rewards"] == {"reward": 1.0}
    creator = observations(run, "self-gen-creator")
    assert "SKILLS:\\nskill-creator\\n" in creator and "marmalade" not in creator
    solver = observations(run, "self-gen-solver")
    assert "SKILLS:\\nmade-skill\\n" in solver and "Made by the creator" in solver
    assert "skill-creator" not in solver.split("SKILLS:")[1] and "marmalade" not in solver.split("SKILLS:")[1]
    assert "READ-ONLY\\nIMAGE:" in solver and "generated-skills" not in solver.split("IMAGE:")[1]
    assert list(result["skills_generated"]) == ["made-skill"]
    assert result["skills_opened"] == ["made-skill", "skill-creator"]
    config = read_json(run / "config.json")
    assert (config["skill_mode"], config["skill_source"]) == ("self-gen", "self_generated")
    assert [scene["name"] for scene in config["trial"]["scenes"]] == ["self-gen-creator", "self-gen-solver"]


@pytest.mark.slow
@pytest.mark.spawns
def test_the_nudge_reaches_the_recorded_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHFLOW_SKILL_NUDGE", "name")
    done = reroll(
        "run", str(TASK), "--agent", "claude-code", "--skills", "with-skill", "--timeout", "120",
        "--model", f"scripted:{TASK}/scripted-model.claude-code.yaml", "--jobs-dir", "jobs",
        "--job-name", "nudge", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = only_folder(tmp_path / "jobs" / "nudge")
    (prompt,) = read_json(run / "prompts.json")
    assert prompt.startswith("Skills available at ~/.claude/skills: greeting. Read them before starting.")
    assert read_json(run / "config.json")["skill_nudge"] == "name"


@pytest.mark.slow
def test_a_no_skill_image_is_built_without_the_skills(docker_images: str) -> None:
    import docker
    from reroll.sandbox.docker.images import ensure_images, task_image

    task = load_task(TASK)
    listing = {}
    with contextlib.closing(docker.from_env()) as client:
        base = ensure_images(client).base
        for hidden in (False, True):
            image = task_image(client, sandbox_spec(with_skills_hidden(task, hidden)), base)
            listing[hidden] = client.containers.run(
                image, ["sh", "-c", "ls /opt/image-skills 2>&1; ls /app"], remove=True
            ).decode()
    assert "greeting" in listing[False]
    assert "No such file" in listing[True] and "notes.txt" in listing[True]


@pytest.mark.slow
@pytest.mark.spawns
def test_a_continuation_mounts_the_original_s_skills_again(
    runs: dict[tuple[str, str], Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The mode is the original's: the replayed probe sees the same skill, so nothing diverges."""
    run = rollout(runs, tmp_path_factory, "claude-code", "with-skill")
    done = reroll("continue", str(run), "--at", "1", "--output", "continued", cwd=run.parent)
    assert done.returncode == 0, done.stderr
    continued = only_folder(run.parent / "continued")
    result, config = read_json(continued / "result.json"), read_json(continued / "config.json")
    assert result["rewards"] == {"reward": 1.0} and result["counts"]["divergences"] == 0
    assert (config["skill_mode"], config["skills"]) == (
        "with-skill",
        read_json(run / "config.json")["skills"],
    )
    assert result["skills_opened"] == ["greeting"]


PLANTING_CREATOR = """#!/bin/sh
# A hostile creator (and solver: the oracle runs this in both scenes): a skill whose SKILL.md is a
# link (followed, the copy would hold /etc/passwd as a regular file), a skill with a FIFO beside
# its SKILL.md (read, the copy would block), a folder without SKILL.md.
cd "$REROLL_WORKSPACE"
if [ -d generated-skills ] || [ ! -e answer.txt ]; then
  mkdir -p generated-skills/linked generated-skills/piped generated-skills/empty
  ln -sf /etc/passwd generated-skills/linked/SKILL.md
  printf -- '---\nname: piped\ndescription: d\n---\n' > generated-skills/piped/SKILL.md
  mkfifo generated-skills/piped/pipe
fi
echo done > answer.txt
"""


@pytest.mark.slow
@pytest.mark.spawns
def test_self_gen_copies_what_the_creator_wrote_without_following_its_links(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    (task / "oracle").mkdir()
    (task / "oracle" / "solve.sh").write_text(PLANTING_CREATOR)
    done = reroll(
        "run", str(task), "--agent", "oracle", "--skills", "self-gen", "--timeout", "60",
        "--jobs-dir", "jobs", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "jobs").glob("*/*")
    result = read_json(run / "result.json")
    assert result["status"] == "ok", result
    assert list(result["skills_generated"]) == ["piped"]  # the linked SKILL.md and the empty folder left out
    assert "linked/ has no SKILL.md: left out" in done.stdout
