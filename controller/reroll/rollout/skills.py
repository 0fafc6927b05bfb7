"""Skill modes in the sandbox: skills mounted read-only at each agent's native skill paths.

As BenchFlow does, the skills are put into the sandbox once and each agent's native paths
(`reroll.agents.AgentSpec.skill_paths`: ``~/.claude/skills``, ``~/.agents/skills`` …) are links to
them. The copy is root's, under ``/etc/reroll/skills/<name>``, its files and folders without
write permission: read-only to an agent that runs as another user (native tasks' ``agent``); an
agent running as root (legacy tasks by default) could change them, as in BenchFlow.

The modes (`reroll.trials.config.SkillMode`), scene by scene (`SceneSkills`, the scheduler's
`reroll.rollout.turns.scenes.SceneHook`):

- ``no-skill``: nothing mounted; the task's ``environment/skills`` is left out of its image
  (`reroll.tasks.task.Task.skills_hidden`); the local sandboxes show only ``environment/workspace``.
- ``with-skill``: the task's ``environment/skills`` (or ``--skills-dir``) mounted before the first scene.
- ``self-gen``: a creator scene (`CREATOR_SCENE`, prepended by `self_gen_trial`) sees only reroll's
  bundled skill-creator and writes skills into ``<workspace>/generated-skills/``; before the next
  scene the creator's mount is removed, what it wrote is copied (as root, never following its
  links) into a read-only folder, mounted in its place, and taken out of the workspace.

An agent without native skill paths gets the mounted skills named in its prompt (the
``description`` nudge, `reroll.tasks.skills.with_nudge`); ``$REROLL_SKILL_NUDGE`` asks for a nudge
for every agent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from reroll_contracts.errors import SandboxError, TaskError
from reroll_contracts.trajectory import Exchange
from rich.console import Console

from reroll.agents import AgentSpec
from reroll.sandbox.base import Sandbox
from reroll.tasks.skills import (
    SKILL_FILE,
    Skill,
    bundled_skills_dir,
    description_of,
    load_skills,
    skills_opened,
    tree_digest,
    with_nudge,
)
from reroll.tasks.task import Task
from reroll.trials.config import (
    DEFAULT_SCENE,
    Role,
    Scene,
    SkillMode,
    SkillNudge,
    SkillSource,
    TrialConfig,
    Turn,
)

SKILLS_ROOT = "/etc/reroll/skills"
"""Where mounted skills are copied, one folder per mount (under the sandbox root)."""
CREATOR_SCENE = "self-gen-creator"
"""The scene ``self-gen`` runs first (BenchFlow's name)."""
SOLVER_SCENE = "self-gen-solver"
"""A plain run's one scene under ``self-gen`` (BenchFlow's name)."""
GENERATED_SKILLS = "generated-skills"
"""The folder of the workspace the creator scene writes its skills into."""
LINK_TIMEOUT_SECONDS = 30.0
COPY_TIMEOUT_SECONDS = 120.0


def creator_skills_dir() -> Path:
    """reroll's bundled skills folder holding only ``skill-creator`` (``self-gen``'s creator scene)."""
    return Path(str(resources.files("reroll").joinpath("rollout", "creator_skills")))


@dataclass(frozen=True)
class SkillSelection:
    """What a rollout's skill mode mounts (config.json's ``skill_*`` fields, resolved)."""

    mode: SkillMode
    source: SkillSource
    folder: Path | None
    """The host folder mounted first: the skills (``with-skill``), the skill-creator (``self-gen``)."""
    skills: list[Skill]


def select_skills(task: Task, mode: SkillMode, skills_dir: Path | None) -> SkillSelection:
    """The skills `mode` mounts for `task`.

    Args:
        task: the task (its ``environment/skills``).
        mode: the skill mode.
        skills_dir: ``--skills-dir`` (``with-skill`` only); None: the task's own.

    Raises:
        TaskError: `skills_dir` with another mode than ``with-skill``; ``with-skill`` without a
            skills folder; a skills folder that is missing, empty, or holds a folder without SKILL.md.
    """
    if skills_dir is not None and mode != "with-skill":
        raise TaskError(f"--skills-dir {skills_dir} needs --skills with-skill (the mode is {mode})")
    if mode == "no-skill":
        return SkillSelection(mode, "none", None, [])
    if mode == "self-gen":
        folder = creator_skills_dir()
        return SkillSelection(mode, "self_generated", folder, load_skills(folder))
    bundled = bundled_skills_dir(task.path)
    if skills_dir is None and not bundled.is_dir():
        raise TaskError(
            f"--skills with-skill: task {task.name} has no skills ({bundled} is missing); "
            "pass --skills-dir DIR (a folder of <name>/SKILL.md)"
        )
    folder = (skills_dir or bundled).resolve()
    source: SkillSource = "task_bundled" if folder == bundled.resolve() else "custom_runtime"
    return SkillSelection(mode, source, folder, load_skills(folder))


def skill_config(selection: SkillSelection) -> dict[str, object]:
    """config.json's skill fields (`reroll.runfolder.run.RunConfig`) for `selection`."""
    return {
        "skill_mode": selection.mode,
        "skill_source": selection.source,
        "effective_skills_dir": str(selection.folder) if selection.folder else None,
        "skills": {skill.name: skill.digest for skill in selection.skills},
    }


def self_gen_trial(trial: TrialConfig, task_prompt: str) -> TrialConfig:
    """`trial` (resolved) with the creator scene first: its first role's agent and model, told
    `creator_prompt`; a plain run's one scene becomes `SOLVER_SCENE`. A trial that has the
    creator scene already (a continuation's) is returned as it is."""
    if trial.scenes[0].name == CREATOR_SCENE:
        return trial
    first = trial.scenes[0].roles[0]
    creator = Scene(
        CREATOR_SCENE,
        [Role("skill_creator", first.agent, first.model)],
        [Turn("skill_creator", creator_prompt(task_prompt))],
    )
    scenes = list(trial.scenes)
    if len(scenes) == 1 and scenes[0].name == DEFAULT_SCENE:
        only = scenes[0]
        scenes = [dataclasses.replace(only, name=SOLVER_SCENE)]
    return trial.model_copy(update={"scenes": [creator, *scenes]})


def creator_prompt(task_prompt: str) -> str:
    """What the creator scene is told (BenchFlow's ``_self_gen_prompt``, in reroll's words)."""
    return (
        "Use the skill-creator skill.\n\n"
        "Write reusable skills for tasks like the one below. Look at the environment only as far as "
        "you need to understand the workflow; do not solve the task itself.\n\n"
        f"<task>\n{task_prompt.strip()}\n</task>\n\n"
        f"Write each skill as {GENERATED_SKILLS}/<skill-name>/{SKILL_FILE} in your working folder "
        "(front matter with name and description, then the steps), with scripts/ or references/ "
        "beside it when they help. A fresh agent will solve the task with only these skills."
    )


async def upload_skills(sandbox: Sandbox, source: Path, name: str) -> str:
    """Copy the host's skills folder `source` into the sandbox at ``SKILLS_ROOT/name``, owned by
    root and without write permission; returns that folder (as the sandbox's processes see it).

    Raises:
        SandboxError: the copy or the permissions could not be made.
    """
    folder = sandbox.layout.path(f"{SKILLS_ROOT}/{name}")
    await _root_script(sandbox, 'rm -rf -- "$1" && mkdir -p -- "$1"', folder)
    await sandbox.upload_dir(source, folder)
    await _root_script(sandbox, 'chmod -R a-w,a+rX -- "$1"', folder)
    return folder


async def link_skills(sandbox: Sandbox, folder: str, agent: AgentSpec, env: Mapping[str, str]) -> list[str]:
    """Link each of `agent`'s native skill paths to `folder`, as the agent's user (so nothing it
    planted is followed with more rights than its own): whatever was at a path is replaced.

    Returns:
        The linked paths (as the sandbox's processes see them); empty for an agent without any.

    Raises:
        SandboxError: a link could not be made (the message names the paths and the cause).
    """
    layout = sandbox.layout
    paths = [
        path.replace("$HOME", layout.home, 1).replace("$WORKSPACE", layout.workspace, 1)
        for path in agent.skill_paths
    ]
    if not paths:
        return []
    script = (
        'src=$1; shift; for dest in "$@"; do mkdir -p -- "$(dirname -- "$dest")" && '
        'rm -rf -- "$dest" && ln -s -- "$src" "$dest" || exit 1; done'
    )
    done = await sandbox.exec(
        ["sh", "-c", script, "link-skills", folder, *paths],
        env=dict(env),
        inherit_env=False,
        user=layout.agent_user,
        timeout_seconds=LINK_TIMEOUT_SECONDS,
    )
    if done.exit_code != 0:
        raise SandboxError(
            f"linking {agent.name}'s skill paths {paths} to {folder} failed: {done.output_text()}"
        )
    return paths


async def mount_skills(
    sandbox: Sandbox, source: Path, agents: Sequence[AgentSpec], env: Mapping[str, str], name: str = "mounted"
) -> str:
    """Mount the host's skills folder `source` read-only at the native skill paths of each of
    `agents`: `upload_skills` once as ``SKILLS_ROOT/name``, then `link_skills` per agent.

    Returns:
        The sandbox folder holding the skills.

    Raises:
        SandboxError: as `upload_skills` and `link_skills`.
    """
    folder = await upload_skills(sandbox, source, name)
    for agent in agents:
        await link_skills(sandbox, folder, agent, env)
    return folder


_COPY_GENERATED = """
gen=$1; dst=$2; old=$3
rm -rf -- "$old" "$dst" && mkdir -p -- "$dst" || exit 1
if [ -d "$gen" ] && [ ! -L "$gen" ]; then cp -R -P -- "$gen"/. "$dst"/ || exit 1; fi
rm -rf -- "$gen"
chown -R -h 0:0 -- "$dst" 2>/dev/null; chmod -R a-w,a+rX -- "$dst"
"""


@dataclass
class SceneSkills:
    """The skills each scene of a rollout sees (`reroll.rollout.turns.scenes.SceneHook`; see the
    module docstring), and what the run folder records of them."""

    sandbox: Sandbox
    env: dict[str, str]
    """The environment of the root-side and link steps (PATH)."""
    agents: dict[str, AgentSpec]
    selection: SkillSelection
    nudge: SkillNudge | None
    console: Console
    mounted: list[Skill] = field(default_factory=list)
    """The skills the current scene sees."""
    folder: str = ""
    """Their folder in the sandbox."""
    by_scene: dict[str, list[str]] = field(default_factory=dict)
    """Scene name → the names of the skills it saw (for `reroll.tasks.skills.skills_opened`)."""
    generated: dict[str, str] | None = None
    """``self-gen``: the skills the creator wrote, name → digest (result.json's ``skills_generated``)."""

    async def enter(self, scene: Scene, index: int) -> None:
        """Mount what `scene` sees, before its first turn."""
        selection = self.selection
        if selection.mode == "with-skill" and index == 0 and selection.folder is not None:
            self.folder = await mount_skills(
                self.sandbox, selection.folder, list(self.agents.values()), self.env
            )
            self.mounted = selection.skills
        elif selection.mode == "self-gen" and scene.name == CREATOR_SCENE and selection.folder is not None:
            self.folder = await mount_skills(
                self.sandbox, selection.folder, list(self.agents.values()), self.env, name="creator"
            )
            self.mounted = selection.skills
        elif selection.mode == "self-gen" and self.generated is None:
            await self._mount_generated()
        self.by_scene[scene.name] = [skill.name for skill in self.mounted]

    async def _mount_generated(self) -> None:
        """Replace the creator's mount by a read-only copy of what it wrote (see the module docstring)."""
        layout = self.sandbox.layout
        folder = layout.path(f"{SKILLS_ROOT}/generated")
        generated = f"{layout.workspace}/{GENERATED_SKILLS}"
        await _root_script(
            self.sandbox, _COPY_GENERATED, generated, folder, layout.path(f"{SKILLS_ROOT}/creator")
        )
        files = await self.sandbox.manifest(folder)
        skills = []
        for name in sorted({path.split("/", 1)[0] for path in files if "/" in path}):
            own = {
                path.split("/", 1)[1]: digest for path, digest in files.items() if path.startswith(f"{name}/")
            }
            digest = own.get(SKILL_FILE)
            if digest is None or ":" in digest:  # missing, or a link, FIFO ... (`Sandbox.manifest`)
                self.console.print(f"[yellow]self-gen: {name}/ has no {SKILL_FILE}: left out[/yellow]")
                await _root_script(self.sandbox, 'rm -rf -- "$1"', f"{folder}/{name}")
                continue
            text = (await self.sandbox.get_file(f"{folder}/{name}/{SKILL_FILE}")).decode(errors="replace")
            skills.append(
                Skill(name=name, description=description_of(text), text=text, digest=tree_digest(own))
            )
        self.generated = {skill.name: skill.digest for skill in skills}
        self.console.print(
            f"[dim]self-gen: the creator wrote {len(skills)} skills: {', '.join(self.generated)}[/dim]"
        )
        for agent in self.agents.values():
            await link_skills(self.sandbox, folder, agent, self.env)
        self.folder, self.mounted = folder, skills

    def opened(self, exchanges: Iterable[Exchange]) -> list[str]:
        """The skills opened in `exchanges` (`reroll.tasks.skills.skills_opened`), each exchange
        checked against the skills its scene saw."""
        every = {name for names in self.by_scene.values() for name in names}
        found: set[str] = set()
        for exchange in exchanges:
            place = exchange.metadata.place
            names = self.by_scene.get(place.scene, []) if place is not None else every
            found.update(skills_opened([exchange], names))
        return sorted(found)

    def prompt(self, agent: AgentSpec, prompt: str) -> str:
        """`prompt` with the nudge `agent` gets for the skills mounted now: the asked-for level,
        else ``description`` for an agent without native skill paths, else none."""
        level = self.nudge or (None if agent.skill_paths else "description")
        if level is None or not self.mounted:
            return prompt
        where = self.folder
        if agent.skill_paths:
            where = agent.skill_paths[0].replace("$HOME", "~", 1).replace("$WORKSPACE", ".", 1)
        return with_nudge(prompt, self.mounted, level, where)


async def _root_script(sandbox: Sandbox, script: str, *args: str) -> None:
    """Run `script` (sh) with `args` as the sandbox's root, before or between the agent's turns.

    Raises:
        SandboxError: it failed (the message carries its output).
    """
    done = await sandbox.exec(
        ["sh", "-c", script, "skills", *args],
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
        inherit_env=False,
        timeout_seconds=COPY_TIMEOUT_SECONDS,
    )
    if done.exit_code != 0:
        raise SandboxError(
            f"preparing the skills failed (exit {done.exit_code}): {done.output_text()[-2000:]}"
        )
