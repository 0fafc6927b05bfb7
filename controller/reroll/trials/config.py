"""Trials: a sequence of scenes in one shared sandbox (seeds/runtime-api-guide.txt, concepts.txt).

A `TrialConfig` holds `Scene`\\ s; a scene declares its `Role`\\ s (each an agent, optionally with
its model) and its `Turn`\\ s (which role acts, told what: ``prompt`` None is the task's
instruction), or names a User (`reroll.trials.users`) that decides each round's prompt. The three axes:

- multi-turn: a role's later turn with ``resume: true`` goes to the same agent session (the
  agent must declare a ``resume`` command in agents.yaml);
- multi-round: a scene with a ``user``: a new agent session per round, the sandbox kept, a soft
  verify between rounds, the User deciding the next prompt (or stopping);
- multi-scene: several scenes; the agent's processes are stopped between two scenes.

Roles of a scene share the sandbox; a role may leave messages for another in
``<workspace>/.outbox/<recipient>.json`` (``{"to": ..., "content": ...}``), read after each turn
and put into the recipient's next prompt. A trial file (YAML)::

    task: ../tasks/fix-failing-test        # optional, relative to this file
    skills: with-skill                     # optional: no-skill, with-skill, self-gen (`reroll run --skills`)
    skills_dir: ../skills                  # optional, with-skill only, relative to this file
    scenes:
      - name: solve
        roles: [{name: solver, agent: mini-swe-agent, model: scripted}]
        user: progressive.py:disclose      # module:function, or FILE.py:function (relative)
        max_rounds: 3
      - name: review
        roles: [{name: coder}, {name: reviewer}]
        turns:
          - {role: coder}
          - {role: reviewer, prompt: "Review the code ..."}

A scene may have a ``persona`` instead of a ``user``: a User played by a model (`Persona`,
`reroll.rollout.turns.persona`), which answers the agent's ask_user questions.

A role without ``agent`` / ``model`` takes the run's (``reroll run --agent/--model``); every
role's model is the one live model of the run. What ran is recorded in ``trial.json`` of the run
folder (a `TrialRecord`); each exchange carries its `reroll_contracts.trajectory.Place`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from reroll_contracts.errors import TrialError

from reroll.trials.users import BaseUser, UserFunction, user_spec
from reroll.yamlfiles import read_mapping

SkillMode = Literal["no-skill", "with-skill", "self-gen"]
"""How a rollout's agents get skills (BenchFlow's ``skill_mode``): ``no-skill`` hides the task's
``environment/skills``; ``with-skill`` mounts them (or ``--skills-dir``) at each agent's native
skill paths; ``self-gen`` runs a creator scene with only a skill-creator skill, then the solver
with only the skills it wrote (`reroll.rollout.skills`)."""
DEFAULT_SKILL_MODE: SkillMode = "no-skill"
"""BenchFlow's default (``normalize_skill_mode(None)``)."""
SkillSource = Literal["none", "task_bundled", "custom_runtime", "self_generated"]
"""Where a rollout's skills came from (BenchFlow's ``skill_source`` values)."""
SkillNudge = Literal["name", "description", "full"]
"""How much of the mounted skills a prompt nudge names (BenchFlow's ``BENCHFLOW_SKILL_NUDGE``):
their names, names and descriptions, or every SKILL.md whole."""


OUTBOX = ".outbox"
"""The folder, under the workspace, where a role leaves messages for another (``<role>.json``)."""
DEFAULT_SCENE = "main"
DEFAULT_ROLE = "agent"
_FORBID = ConfigDict(extra="forbid")


@dataclass(config=_FORBID)
class Role:
    """An agent taking part in a scene."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """The role's name (turns and outbox files name it)."""
    agent: str | None = None
    """The agent (``reroll agents``) [default: the run's ``--agent``]."""
    model: str | None = None
    """The live model [default: the run's ``--model``]; all roles of a trial share one."""


@dataclass(config=_FORBID)
class Turn:
    """One prompt to one role."""

    role: str
    """The role that acts."""
    prompt: str | None = None
    """What it is told; None: the task's instruction."""
    resume: bool = False
    """Continue the role's previous session of this scene (multi-turn) instead of a new one;
    the agent must declare ``resume`` in agents.yaml."""


@dataclass(config=_FORBID)
class Persona:
    """A User played by a model (`reroll.rollout.turns.persona`): it gives the task's instruction in
    round 0, and answers the agent's ask_user questions as the model playing `text` says; with
    `prompts`, the model also writes each later round's prompt. A trial file's ``persona``::

        persona:
          text: "You are Camille, who reads only French ..."   # or file: camille.md (relative)
          model: scripted:persona.yaml                          # --user-model overrides it
          prompts: false                                        # true: it writes later rounds' prompts
    """

    text: str | None = None
    """Who the model plays (its system prompt); `load_trial` reads `file` into it."""
    file: Path | None = None
    """A file holding `text` (a trial file's is relative to the file)."""
    model: str | None = None
    """The model playing it (a ``--model`` spec; a relative ``scripted:PATH`` is relative to the
    trial file); ``--user-model`` overrides it."""
    timeout_sec: float = Field(default=120.0, gt=0)
    """Wall-clock budget of one call of the model, in seconds."""
    prompts: bool = False
    """Also decide each later round's prompt: the model reads the round's result (the soft
    verify's rewards and output) and writes the next message, or ``DONE`` to end the scene (at
    most the scene's ``max_rounds``); False: the scene is one round."""

    @model_validator(mode="after")
    def _one_source(self) -> Persona:
        if (self.text is None) == (self.file is None):
            raise ValueError("a persona has either text or file (not both, not neither)")
        return self


@dataclass(config=_FORBID)
class Scene:
    """One interaction region: its roles take turns (or a User drives rounds) in the shared sandbox."""

    name: str = DEFAULT_SCENE
    roles: list[Role] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    """The fixed prompt sequence; empty in a scene a `user` drives."""
    user: str | None = None
    """A User deciding each round's prompt (`reroll.trials.users.load_user`): ``module:attribute`` or
    ``path/to/file.py:attribute`` (a function, a `BaseUser` subclass or instance); in Python,
    `reroll.trials.users.user_spec` names a function or class."""
    max_rounds: int = Field(default=10, ge=1)
    """With a `user`: at most this many rounds."""
    persona: Persona | None = None
    """Instead of `user`: a User played by a model (`Persona`); at most one scene of a trial has one."""
    reset_environment: bool = False
    """Before this scene (not the first: it starts there anyway), return the task's environment to
    its per-task baseline (BenchFlow's ``reset()``, `reroll.environment.services.Environment.reset`):
    its services restarted and its declared state restored as it was before the first agent ran;
    the workspace stays as the earlier scenes left it. False: the scene goes on from their state."""

    @property
    def driven(self) -> bool:
        """A User (`user` or `persona`) decides the scene's rounds."""
        return self.user is not None or self.persona is not None

    @model_validator(mode="after")
    def _consistent(self) -> Scene:
        names = [role.name for role in self.roles]
        if not names:
            raise ValueError(f"scene {self.name!r}: no roles")
        if len(set(names)) != len(names):
            raise ValueError(f"scene {self.name!r}: role names repeat: {names}")
        if self.user is not None and self.persona is not None:
            raise ValueError(f"scene {self.name!r}: a user or a persona, not both")
        if self.driven:
            if len(self.roles) != 1 or self.turns:
                raise ValueError(f"scene {self.name!r}: a User drives one role and declares no turns")
            return self
        if not self.turns:
            raise ValueError(f"scene {self.name!r}: no turns (and no user)")
        acted: set[str] = set()
        for index, turn in enumerate(self.turns):
            if turn.role not in names:
                raise ValueError(
                    f"scene {self.name!r}, turn {index}: unknown role {turn.role!r} (roles: {names})"
                )
            if turn.resume and turn.role not in acted:
                raise ValueError(
                    f"scene {self.name!r}, turn {index}: resume needs an earlier turn of {turn.role!r}"
                )
            acted.add(turn.role)
        return self

    @classmethod
    def single(
        cls,
        agent: str | None = None,
        model: str | None = None,
        prompt: str | None = None,
        *,
        name: str = DEFAULT_SCENE,
        user: str | UserFunction | type[BaseUser] | None = None,
        max_rounds: int = 10,
    ) -> Scene:
        """The one-role scene: `agent` told `prompt` (None: the instruction), or driven by `user`
        (a spec, or a module-level function or `BaseUser` subclass: `reroll.trials.users.user_spec`).

        Raises:
            TrialError: `user` cannot be named (`reroll.trials.users.user_spec`).
        """
        if user is not None and not isinstance(user, str):
            user = user_spec(user)
        role = Role(DEFAULT_ROLE, agent, model)
        turns = [] if user is not None else [Turn(DEFAULT_ROLE, prompt)]
        return cls(name=name, roles=[role], turns=turns, user=user, max_rounds=max_rounds)

    def role(self, name: str) -> Role:
        """The role called `name` (validated to exist for every turn)."""
        return next(role for role in self.roles if role.name == name)


class TrialConfig(BaseModel):
    """A trial: scenes in one shared sandbox, on one task (see the module docstring)."""

    model_config = _FORBID
    task: Path | None = None
    """The task folder (a trial file's is relative to the file); None: the task given to ``run``."""
    skills: SkillMode | None = None
    """The skill mode (``reroll run --skills``, which wins); None: the run's."""
    skills_dir: Path | None = None
    """The skills folder of ``with-skill`` (``--skills-dir``; a trial file's is relative to the
    file); None: the run's, else the task's ``environment/skills``."""
    scenes: list[Scene] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_scenes(self) -> TrialConfig:
        names = [scene.name for scene in self.scenes]
        if len(set(names)) != len(names):
            raise ValueError(f"scene names repeat: {names}")
        personas = [scene.name for scene in self.scenes if scene.persona is not None]
        if len(personas) > 1:
            raise ValueError(f"scenes {personas} each have a persona: one persona per trial")
        return self

    @property
    def persona(self) -> Persona | None:
        """The trial's persona User, if a scene has one."""
        return next((scene.persona for scene in self.scenes if scene.persona is not None), None)

    @classmethod
    def single(cls, agent: str | None = None, model: str | None = None) -> TrialConfig:
        """The one-prompt trial every plain ``reroll run`` is."""
        return cls(scenes=[Scene.single(agent, model)])

    def user_files(self) -> list[str]:
        """The Users of its scenes that a file holds (``path/to/file.py:attribute``): host files
        a rollout of this trial imports (an importable ``module:attribute`` is not one)."""
        return [
            scene.user
            for scene in self.scenes
            if scene.user is not None and scene.user.rpartition(":")[0].endswith(".py")
        ]

    def resolved(self, agent: str | None, model: str | None) -> TrialConfig:
        """This trial with every role's agent and model filled in.

        Args:
            agent: the agent of roles that name none (``--agent``).
            model: the live model (``--model``); wins over the roles' own.

        Raises:
            TrialError: a role has no agent and `agent` is None, or roles name different models.
        """
        models = {role.model for scene in self.scenes for role in scene.roles if role.model}
        if model is None and len(models) > 1:
            raise TrialError(
                f"the trial's roles name different models {sorted(models)}: one live model per trial"
            )
        live = model or (models.pop() if models else None)
        scenes = []
        for scene in self.scenes:
            roles = []
            for role in scene.roles:
                if (role_agent := role.agent or agent) is None:
                    raise TrialError(
                        f"scene {scene.name!r}, role {role.name!r}: no agent (name one, or pass --agent)"
                    )
                roles.append(Role(role.name, role_agent, live))
            scenes.append(dataclasses.replace(scene, roles=roles))
        return self.model_copy(update={"scenes": scenes})

    @property
    def model(self) -> str | None:
        """The live model of a `resolved` trial."""
        return self.scenes[0].roles[0].model

    @property
    def agents(self) -> list[str]:
        """The agents of a `resolved` trial, each once, first use first."""
        return list(dict.fromkeys(role.agent for scene in self.scenes for role in scene.roles if role.agent))


def load_trial(path: Path) -> TrialConfig:
    """Load a trial file (YAML, see the module docstring): ``task``, ``user`` file paths and
    ``scripted:PATH`` models are made absolute, relative to the file's folder.

    Raises:
        TrialError: the file is missing, not YAML, or not a valid trial (the message names it).
    """
    data = read_mapping(path, TrialError, "trial file", "scenes:")
    try:
        trial = TrialConfig.model_validate(data)
    except ValidationError as exc:
        raise TrialError(f"{path}: not a valid trial file:\n{exc}") from exc
    base = path.resolve().parent
    scenes = [
        dataclasses.replace(
            scene,
            roles=[Role(role.name, role.agent, _anchored_model(role.model, base)) for role in scene.roles],
            user=_anchored(scene.user, base),
            persona=_read_persona(path, scene.persona, base),
        )
        for scene in trial.scenes
    ]
    task = (base / trial.task).resolve() if trial.task is not None else None
    skills_dir = (base / trial.skills_dir).resolve() if trial.skills_dir is not None else None
    return trial.model_copy(update={"task": task, "skills_dir": skills_dir, "scenes": scenes})


def _read_persona(path: Path, persona: Persona | None, base: Path) -> Persona | None:
    """`persona` with its file read into its text and its scripted model anchored at `base`.

    Raises:
        TrialError: the persona's file cannot be read (the message names it and the trial file).
    """
    if persona is None:
        return None
    text = persona.text
    if persona.file is not None:
        file = base / persona.file
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise TrialError(f"{path}: persona file {file}: cannot be read ({exc})") from exc
    if not (text or "").strip():
        raise TrialError(f"{path}: the persona's text is empty")
    return Persona(
        text=text,
        model=_anchored_model(persona.model, base),
        timeout_sec=persona.timeout_sec,
        prompts=persona.prompts,
    )


def _anchored_model(model: str | None, base: Path) -> str | None:
    """A ``scripted…:PATH`` model with a relative PATH made absolute against `base`."""
    kind, colon, script = (model or "").partition(":")
    return f"{kind}:{_absolute(script, base)}" if colon and kind.startswith("scripted") else model


def _anchored(user: str | None, base: Path) -> str | None:
    """A ``FILE.py:attribute`` User with a relative FILE made absolute against `base`."""
    target, colon, attribute = (user or "").rpartition(":")
    return f"{_absolute(target, base)}:{attribute}" if colon and target.endswith(".py") else user


def _absolute(path: str, base: Path) -> str:
    return path if Path(path).is_absolute() else str((base / path).resolve())


PromptSource = Literal["instruction", "trial", "user", "recorded", "branch"]
"""Where a turn's prompt came from (`TurnRecord.prompt_source`)."""
TurnStatus = Literal["ok", "timeout", "error", "stopped"]
"""How a turn's agent ended (`TurnRecord.status`)."""
