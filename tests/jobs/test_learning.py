"""Continual learning end to end: a sequential-shared job over a learner store, in the local sandbox.

The agent is the dozen-line urllib agent of `tests.jobs.test_branch` driven by the scripted
model: each rollout adds one skill through Claude Code's native skill path (``~/.claude/skills``,
a link to the store's ``skills/``) and one line to ``memory/``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.agents import AGENTS_FILE_ENV, registry
from reroll.export import export_lines
from reroll.jobs.branch import branch
from reroll.jobs.folder_archive import pack, pack_file
from reroll.jobs.jobfile import JobSpec, RunnerOptions, load_job_file
from reroll.jobs.runner import run_job
from reroll.rollout.commands.continue_ import continue_run
from reroll.runfolder.store import list_generations, load_head, rollback_store
from reroll.view import build_site
from reroll_contracts.errors import JobError
from rich.console import Console

from tests.jobs.test_branch import URLLIB_AGENTS
from tests.jobs.test_runner import write_task

ADD_SKILL = (
    'n=$(($(ls "$REROLL_SKILLS_DIR" | wc -l) + 1)) && mkdir -p ~/.claude/skills/skill-$n && '
    "printf -- '---\\nname: skill-%s\\ndescription: learned\\n---\\n' $n "
    "> ~/.claude/skills/skill-$n/SKILL.md && "
    'echo "rollout $n" >> "$REROLL_MEMORY_DIR/notes.md" && echo skills: $(ls "$REROLL_SKILLS_DIR")'
)
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
SCRIPT = {
    "turns": [
        {"content": "Learning.", "tool_calls": [{"name": "bash", "arguments": {"command": ADD_SKILL}}]},
        {"content": "Done.", "tool_calls": [{"name": "bash", "arguments": {"command": SUBMIT}}]},
    ]
}


@pytest.fixture
def learner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A task (reward 1) and the scripted model spec whose agent adds a skill per rollout; the
    urllib agent declared."""
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(URLLIB_AGENTS))
    monkeypatch.setenv(AGENTS_FILE_ENV, str(tmp_path / "agents.yaml"))
    registry.cache_clear()
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    yield write_task(tmp_path, "learn", "true"), f"scripted:{tmp_path / 'script.yaml'}"
    registry.cache_clear()


def skills(generation_files: dict[str, str]) -> list[str]:
    return sorted(path.split("/")[1] for path in generation_files if path.startswith("skills/"))


async def branch_on_ray(run: Path, model: str, store: Path, tmp_path: Path) -> None:
    """A branch of `run` (a rollout of a sequential-shared job) on a local Ray instance: the store
    and the model's script travel to the worker as they would to another machine (they reach its
    cache), and the child's config.json names the controller's store."""
    from reroll.jobs.ray_executor import worker_root  # needs ray (the dev extra)

    on_ray = await branch(
        run,
        at=1,
        models=[model],
        output=tmp_path / "branched-ray",
        runner=RunnerOptions(executor="ray", concurrency=1),
        console=Console(quiet=True),
    )
    child = Path(on_ray.parent) / on_ray.children[0].folder
    assert on_ray.children[0].status == "ok"
    assert json.loads((child / "config.json").read_text())["learner_store"] == {
        "path": str(store),
        "generation": 1,
        "writes_back": False,
    }
    assert "skills: skill-1 skill-2" in (child / "trajectory" / "llm_trajectory.jsonl").read_text()
    cached = worker_root() / "folders"  # this machine is the worker node of the local Ray instance
    assert (cached / pack(store).digest / "generations" / "1.json").is_file()
    script = Path(model.partition(":")[2])
    assert (cached / pack_file(script).digest / script.name).read_bytes() == script.read_bytes()
    agents = Path(os.environ[AGENTS_FILE_ENV])  # the urllib agent's declaration travelled too
    assert (cached / pack_file(agents).digest / agents.name).read_bytes() == agents.read_bytes()


@pytest.mark.slow
async def test_sequential_shared_job_rollback_and_continue(tmp_path: Path, learner: tuple[Path, str]) -> None:
    task, model = learner
    spec = JobSpec(
        name="cl",
        tasks=[task],
        agents=["urllib-chat"],
        models=[model],
        repeats=3,
        timeout_seconds=120,
        schedule="sequential-shared",
    )
    summary = await run_job(spec, jobs_dir=tmp_path / "jobs", console=Console(quiet=True))
    job, store = tmp_path / "jobs" / "cl", tmp_path / "jobs" / "cl" / "store"

    # Generations 0 → 3, each one skill more than its parent, made by the rollouts in order.
    assert summary.totals.status_counts == {"ok": 3}
    generations = list_generations(store)
    assert [(g.number, g.parent) for g in generations] == [(0, None), (1, 0), (2, 1), (3, 2)]
    assert [skills(g.files) for g in generations] == [
        [],
        ["skill-1"],
        ["skill-1", "skill-2"],
        ["skill-1", "skill-2", "skill-3"],
    ]
    assert [(r.store_generation, r.made_generation) for r in summary.rollouts] == [(0, 1), (1, 2), (2, 3)]
    assert summary.store is not None and summary.store[2].changes.added == ["skills/skill-2/SKILL.md"]
    assert summary.store[2].changes.modified == ["memory/notes.md"] and summary.store[2].reward == 1.0
    r2 = job / summary.rollouts[1].name
    assert json.loads((r2 / "config.json").read_text())["learner_store"] == {
        "path": str(store),
        "generation": 1,
        "writes_back": True,
    }

    # A continuation of rollout 2 mounts generation 1 again, and never writes the store back.
    continued = await continue_run(r2, at=1, console=Console(quiet=True))
    assert continued.result.status == "ok" and continued.result.learner_store is None
    config = json.loads((continued.run_dir / "config.json").read_text())
    assert config["learner_store"]["generation"] == 1 and config["learner_store"]["writes_back"] is False
    trajectory = (continued.run_dir / "trajectory" / "llm_trajectory.jsonl").read_text()
    assert "skills: skill-1 skill-2" in trajectory  # generation 1 mounted, skill-2 added in the sandbox
    tree = await branch(r2, at=1, models=[model], output=tmp_path / "branched", console=Console(quiet=True))
    child = Path(tree.parent) / tree.children[0].folder
    assert json.loads((child / "config.json").read_text())["learner_store"]["writes_back"] is False
    if importlib.util.find_spec("ray") is not None:  # the dev extra has it
        await branch_on_ray(r2, model, store, tmp_path)
    assert len(list_generations(store)) == 4 and load_head(store).generation == 3

    # A job killed after rollout 3 ended but before its generation was recorded: resume records it.
    (store / "generations" / "3.json").unlink()
    (store / "head.json").write_text('{"generation": 2}')
    again = await run_job(spec, jobs_dir=tmp_path / "jobs", console=Console(quiet=True))
    assert [r.attempts for r in again.rollouts] == [0, 0, 0]
    assert (again.rollouts[2].store_generation, again.rollouts[2].made_generation) == (2, 3)
    assert skills(list_generations(store)[3].files) == ["skill-1", "skill-2", "skill-3"]

    # Rollback to 1, then a fourth rollout (the job resumed with one more repeat) starts from it.
    rollback_store(store, 1)
    resumed = await run_job(
        spec.model_copy(update={"repeats": 4}), jobs_dir=tmp_path / "jobs", console=Console(quiet=True)
    )
    assert [r.attempts for r in resumed.rollouts] == [0, 0, 0, 1]
    fourth = resumed.rollouts[3]
    assert (fourth.store_generation, fourth.made_generation) == (1, 4)
    four = list_generations(store)[4]
    assert four.parent == 1 and skills(four.files) == ["skill-1", "skill-2"]
    head = load_head(store)
    assert head.generation == 4 and [(r.from_generation, r.to_generation) for r in head.rollbacks] == [(3, 1)]

    check_view_and_exports(job, tmp_path / "site", fourth.name)


def check_view_and_exports(job: Path, site: Path, fourth: str) -> None:
    """The view's job page lists the generations; the run page of the `fourth` rollout and the
    exports carry the generation each rollout started from."""
    index = build_site(job, site).read_text()
    assert 'id="generations"' in index and "+skills/skill-3/SKILL.md" in index
    assert "rollback" in index and "generation 3 → 1" in index
    fourth_page = (site / "runs" / f"{fourth}.html").read_text()
    assert 'id="learner-store">generation 1 (written back)' in fourth_page
    extractors: list[tuple[str, Callable[[Any], Any]]] = [
        ("atif", lambda record: record["extra"]["reroll"]["learner_store"]),
        ("verifiers", lambda record: record["info"]["learner_store"]),
    ]
    for format, extract in extractors:
        records = [json.loads(line) for line in b"".join(export_lines(job, format)).splitlines()]
        assert [extract(record)["generation"] for record in records] == [0, 1, 2, 1], format


def test_store_needs_the_sequential_schedule(tmp_path: Path) -> None:
    file = tmp_path / "job.yaml"
    file.write_text("tasks: [t]\nagents: [oracle]\nstore: seed\n")
    with pytest.raises(JobError, match=r"job\.yaml: invalid job: store needs schedule sequential-shared"):
        load_job_file(file)
    file.write_text("tasks: [t]\nagents: [oracle]\nschedule: sequential\n")
    with pytest.raises(JobError, match=r"job\.yaml: invalid job:(.|\n)*schedule(.|\n)*sequential-shared"):
        load_job_file(file)


PLANT = (
    'ln -s /etc/passwd "$REROLL_SKILLS_DIR/passwd" && mkfifo "$REROLL_MEMORY_DIR/pipe" && '
    'ln -s / "$REROLL_LEARNER_STORE/root" && mkdir -p "$REROLL_SKILLS_DIR/ok" && '
    'echo fine > "$REROLL_SKILLS_DIR/ok/SKILL.md" && ! mv "$REROLL_LEARNER_STORE" /tmp/moved'
)


@pytest.mark.spawns
async def test_the_store_takes_back_regular_files_only(tmp_path: Path) -> None:
    """An agent that plants links (to /etc/passwd, to /) and a FIFO in the store, and tries to
    move the store itself away (its parent is root's): only its regular file becomes part of
    the next generation, the rest is listed as left out, and nothing outside the store is read."""
    task = write_task(tmp_path, "plant", PLANT)
    spec = JobSpec(name="p", tasks=[task], agents=["oracle"], schedule="sequential-shared")
    summary = await run_job(spec, jobs_dir=tmp_path / "jobs", console=Console(quiet=True))
    assert summary.rollouts[0].status == "ok", summary.rollouts[0].error
    store = tmp_path / "jobs" / "p" / "store"
    assert list_generations(store)[1].files.keys() == {"skills/ok/SKILL.md"}
    result = json.loads((tmp_path / "jobs" / "p" / summary.rollouts[0].name / "result.json").read_text())
    assert sorted(result["learner_store"]["left_out"]) == [
        "memory/pipe: fifo",
        "root: symlink",
        "skills/passwd: symlink",
    ]
