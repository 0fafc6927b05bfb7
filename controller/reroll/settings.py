"""How a rollout runs: the one settings model, `RolloutSettings`.

Every way of starting a rollout builds one — the CLI (`reroll.cli.flags`), a job file
(`reroll.jobs.jobfile.JobSpec.settings`), the Python API (``reroll.RolloutSettings(...)``), a
trial file under them (`recording_settings`) — and
a continuation, branch, replay or re-score derives its own from the original run's recorded
settings (`recorded_settings`, read from its config.json) with `continuation_settings`: each
field declares how it carries over (`Carry`), so no caller merges the two by hand.

The backend's settings (``sandbox_config``) are parsed once, where they enter — the CLI's JSON, a
job file's or config.json's mapping, as soon as the backend is known — by the backend's own
pydantic model (`reroll.sandbox.base.Backend.settings`), and travel as that model's instance to
the backend (`reroll.sandbox.base.create_sandbox`); only settings given without a backend wait,
as an `UnboundSandboxConfig`, for the backend the rollout turns out to run on.

The host paths a rollout reads are a field kind of their own (`Ships`): an executor that runs the
rollout on another machine finds them by introspection (`RolloutSettings.paths_read`,
`RolloutSettings.relocated`, `reroll.jobs.ray_executor`), never from a hand-kept list.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    JsonValue,
    field_serializer,
    model_validator,
)
from reroll_contracts.faults import FaultsUsed
from reroll_contracts.network import NetworkPolicy
from reroll_contracts.proxy import DivergencePolicy

from reroll.models.spec import resolved_spec, script_file, with_script_file
from reroll.runfolder.run import RunConfig, StoreUse
from reroll.sandbox.base import load_backend
from reroll.trials.config import SkillMode, TrialConfig

DEFAULT_SANDBOX = "local"
"""The backend a rollout runs on when neither the caller nor the original run names one."""


DEFAULT_CHECKPOINT_KEEP = 64
"""How many per-step pool checkpoints a recording on ``local`` with copy-on-write keeps unless told
(`RolloutSettings.checkpoint_keep`)."""


class Carry(enum.Enum):
    """How a setting of the original run carries over to a continuation, branch, replay or re-score
    (`continuation_settings`)."""

    OVERRIDABLE = "overridable"
    """The given value, else the original's (None: not given)."""
    MERGED = "merged"
    """A mapping: the original's updated key by key by the given one — on the original's backend
    only (`RolloutSettings.sandbox`); on another backend the given one alone."""
    FRESH = "fresh"
    """The given value (or the default): the original's never carries over."""


@dataclass(frozen=True)
class Ships:
    """Field metadata: the field names a host path the rollout reads, which an executor on
    another machine carries there (`RolloutSettings.paths_read`)."""

    kind: Literal["path", "store", "model"]
    """``path``: a `Path`; ``store``: a `StoreUse` (its ``path``); ``model``: a model spec whose
    ``scripted*:PATH`` names a script file (`reroll.models.spec.script_file`)."""


class UnboundSandboxConfig(BaseModel):
    """Backend settings given without naming the backend (``--sandbox-config`` or ``--image-map``
    without ``--sandbox``: a continuation runs on its original's backend, each run of
    ``continue-job`` on its own): the JSON object as given, parsed once by the model of the
    backend the rollout turns out to run on (`bound`), as soon as that is known
    (`recording_settings`, `continuation_settings`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    given: dict[str, JsonValue]
    """The settings as given, by field name of the backend's config model."""

    def bound(self, backend: str, under: BaseModel | None = None) -> BaseModel:
        """These settings parsed by `backend`'s config model, over `under` (that backend's
        settings, e.g. the original run's) key by key.

        Raises:
            SandboxBackendError: `backend` is unknown, or a setting is unknown or invalid for it.
        """
        return over_settings(under, load_backend(backend).settings(self.given))


def over_settings(under: BaseModel | None, over: BaseModel) -> BaseModel:
    """`over` (a backend's settings) over `under` (the same backend's, or None) key by key: the
    fields `over` was given (``model_fields_set``) replace `under`'s; neither is validated again."""
    if under is None:
        return over
    return under.model_copy(update={name: getattr(over, name) for name in over.model_fields_set})


HostPath = Annotated[Path | None, Ships("path")]
"""A host file or folder the rollout reads."""
HostStore = Annotated[StoreUse | None, Ships("store")]
"""A learner store generation the rollout mounts (its folder is read)."""
HostModel = Annotated[str | None, Ships("model")]
"""A model spec; a ``scripted*:PATH`` one reads its script file."""


class RolloutSettings(BaseModel):
    """How a rollout runs: everything the CLI flags, a job file's fields and the Python API set.

    Every None means "not given": a new recording takes the default named, a rollout from a
    checkpoint of a recorded run the original's (by the field's `Carry`, `continuation_settings`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    timeout_seconds: Annotated[float | None, Carry.OVERRIDABLE] = None
    """The agent's wall-clock budget, seconds [default: the original's, else the task's]."""
    sandbox: Annotated[str | None, Carry.OVERRIDABLE] = None
    """Sandbox backend, ``local``, ``local-plain``, ``docker`` or a dotted path [default: the
    original's, else ``local``]."""
    sandbox_config: Annotated[BaseModel | UnboundSandboxConfig | None, Carry.MERGED] = None
    """Settings of the sandbox backend: an instance of its config model
    (`reroll.sandbox.base.Backend`; a mapping, e.g. ``{"image_map": {...}}`` for docker, is parsed
    by it on construction when `sandbox` is given, else kept as an `UnboundSandboxConfig`). From
    a checkpoint on the original's backend, they update the original's settings key by key (so
    its recorded ``image_map`` rebuilds the same image); on another backend, the original's are
    dropped [default: the original's, else none: the backend's defaults]."""
    network: Annotated[NetworkPolicy | None, Carry.OVERRIDABLE] = None
    """The sandbox's network policy [default: the original's override, else the task's
    ``environment.network``]; ``none`` needs docker or the isolated ``local``."""
    environment_manifest: Annotated[HostPath, Carry.OVERRIDABLE] = None
    """An environment manifest file bound instead of the task's own (BenchFlow's
    ``--environment-manifest``, `reroll.tasks.manifest.resolve_manifest`) [default: the original's,
    else the task's]."""
    environment_services: Annotated[tuple[str, ...] | None, Carry.OVERRIDABLE] = None
    """Only these of the environment's services start (``--state``'s ``tools``) [default: the
    original's, else all]."""
    faults: Annotated[FaultsUsed | None, Carry.FRESH] = None
    """The fault plan the proxy injects (`reroll.host.llm_proxy.faults_used`), or None; faults
    recorded in a replayed trajectory are reproduced either way (not inherited as a plan)."""
    max_steps: Annotated[int | None, Carry.FRESH] = Field(default=None, ge=1)
    """Cut the rollout once it served this many steps (model requests: replayed, live and faults
    injected alike): the next request is refused and the run ends ``timeout`` with category
    ``step_limit``, verified as a timed-out run is, and ``reroll continue`` takes it; None: no limit.
    A continuation counts its replayed steps too."""
    checkpoint_every: Annotated[int, Carry.FRESH] = Field(default=0, ge=0)
    """Capture a three-layer checkpoint every this many steps while the agent runs live
    (`reroll.rollout.layers`; ``<run>/checkpoints/step-K/``), which ``branch --via snapshot``
    forks from instead of rebuilding the prefix; 0 (the default): none (but see `checkpoint_keep`)."""
    checkpoint_keep: Annotated[int, Carry.FRESH] = Field(default=DEFAULT_CHECKPOINT_KEEP, ge=0)
    """Keep a pool checkpoint at every step, at most this many (at least 2;
    `reroll.rollout.extensions.checkpoints.retained`): a recording on the isolated ``local``
    sandbox with a copy-on-write disk snapshots the workspace, HOME and ``/`` at every step (the
    agent's request held about 5 ms a step: docs/sandboxes.md); every step of a run of up to this
    many steps is kept, beyond, the latest half of them every step and the earlier ones thinned to
    an even stride (a branch starts from the nearest earlier one and replays the remainder).
    Default `DEFAULT_CHECKPOINT_KEEP`; 0: off. Elsewhere (docker, ext4) it does nothing."""
    divergence_policy: Annotated[DivergencePolicy, Carry.FRESH] = "warn"
    """What the proxy does when a replayed request differs from the recording (``warn``,
    ``strict``, ``cutover``); a recording replays nothing, so it never applies there."""
    skill_mode: Annotated[SkillMode | None, Carry.OVERRIDABLE] = None
    """How the agents get skills (`reroll.rollout.skills`) [default: the original's, else the
    trial's, else ``no-skill``]."""
    skills_dir: Annotated[HostPath, Carry.OVERRIDABLE] = None
    """The skills folder of ``with-skill`` [default: the original's ``--skills-dir`` when the
    rollout runs ``with-skill``, else the trial's, else the task's ``environment/skills``]."""
    learner_store: Annotated[HostStore, Carry.OVERRIDABLE] = None
    """A new recording's learner store generation (a ``sequential-shared`` job's rollout,
    `reroll.jobs.learning`); None: none. A rollout from a checkpoint mounts this generation
    [default: the original's], always read-only to the store (``writes_back`` False)."""
    judge_model: Annotated[HostModel, Carry.OVERRIDABLE] = None
    """A judge's model (``--judge-model``: an LLM or agent judge's) [default: the original's, else
    the task's]."""
    ask_user: Annotated[bool | None, Carry.OVERRIDABLE] = None
    """Offer the agent reroll's ``ask_user`` tool over MCP (`reroll.rollout.turns.asks`) [default: the
    original's, else not]; every agent of the rollout must have an MCP client."""
    without_mcp: Annotated[bool | None, Carry.OVERRIDABLE] = None
    """Run the agents without the task's MCP servers (``--without-mcp``, `reroll.rollout.mcp`): a
    baseline that scores what an agent reaches without the task's tools (an agent with no MCP
    client otherwise gets them through reroll's bridge) [default: the original's, else not]."""
    user_model: Annotated[HostModel, Carry.OVERRIDABLE] = None
    """A persona User's model (``--user-model``, `reroll.rollout.turns.persona`) [default: the
    original's, else the trial's persona's ``model``]."""
    trust: Annotated[tuple[str, ...], Carry.FRESH] = ()
    """Host code a recorded run names that the user reviewed and runs again (``--trust``: a
    User's file, a module or an out-of-tree backend's dotted path; `reroll.rollout.trust`); a
    rollout from a checkpoint imports no other. A new recording needs none."""

    @model_validator(mode="before")
    @classmethod
    def _parse_sandbox_config(cls, data: Any) -> Any:
        """A mapping given as ``sandbox_config`` parsed by the config model of the backend
        ``sandbox`` names (`reroll.sandbox.base.Backend.settings`), or kept unbound without one.

        Raises:
            SandboxBackendError: the backend is unknown, or a setting is unknown or invalid for it
                (the message names the backend and the field).
        """
        if not isinstance(data, Mapping) or not isinstance(given := data.get("sandbox_config"), Mapping):
            return data
        backend = data.get("sandbox")
        if isinstance(backend, str):
            return {**data, "sandbox_config": load_backend(backend).settings(given)}
        return {**data, "sandbox_config": UnboundSandboxConfig(given=dict(given))}

    @field_serializer("sandbox_config")
    def _dump_sandbox_config(
        self, value: BaseModel | UnboundSandboxConfig | None, info: FieldSerializationInfo
    ) -> dict[str, Any] | None:
        """The backend's settings as given (the fields set), so a dump parses back to the same."""
        if value is None:
            return None
        if isinstance(value, UnboundSandboxConfig):
            return dict(value.given)
        return value.model_dump(mode=info.mode, exclude_unset=True)

    def recorded_sandbox_config(self) -> dict[str, Any]:
        """``sandbox_config`` as config.json records it (`reroll.runfolder.run.RunConfig`): the
        fields given, as JSON; empty when none were."""
        dumped = self.model_dump(mode="json", include={"sandbox_config"})
        recorded: dict[str, Any] = dumped["sandbox_config"] or {}
        return recorded

    def paths_read(self) -> tuple[Path, ...]:
        """The host paths these settings name, which the rollout reads (what an executor on another
        machine carries there, `reroll.jobs.ray_executor`): every `Ships` field's, in field order."""
        found = (_ship_path(ships, getattr(self, name)) for name, ships in _shipped_fields())
        return tuple(path for path in found if path is not None)

    def relocated(self, moved: Callable[[Path], Path]) -> RolloutSettings:
        """These settings with each path of `paths_read` replaced by ``moved(path)``."""
        update = {name: _ship_moved(ships, getattr(self, name), moved) for name, ships in _shipped_fields()}
        return self.model_copy(update=update)


def carry_of(name: str) -> Carry:
    """The `Carry` field `name` of `RolloutSettings` declares."""
    return next(meta for meta in RolloutSettings.model_fields[name].metadata if isinstance(meta, Carry))


def _shipped_fields() -> Iterator[tuple[str, Ships]]:
    """The fields of `RolloutSettings` of a `Ships` kind, with it."""
    for name, info in RolloutSettings.model_fields.items():
        for meta in info.metadata:
            if isinstance(meta, Ships):
                yield name, meta


def _ship_path(ships: Ships, value: Any) -> Path | None:
    """The host path `value` (a field of kind `ships`) names, or None."""
    if value is None:
        return None
    if ships.kind == "store":
        return Path(value.path)
    if ships.kind == "model":
        return script_file(value)
    return Path(value)


def _ship_moved(ships: Ships, value: Any, moved: Callable[[Path], Path]) -> Any:
    """`value` (a field of kind `ships`) naming ``moved(path)`` instead of its host path."""
    path = _ship_path(ships, value)
    if path is None:
        return value
    if ships.kind == "store":
        return value.model_copy(update={"path": str(moved(path))})
    if ships.kind == "model":
        return with_script_file(value, moved(path))
    return moved(path)


def trial_settings(trial: TrialConfig) -> RolloutSettings:
    """The settings a trial file sets (its ``skills`` and ``skills_dir``, `reroll.trials.config`)."""
    return RolloutSettings(skill_mode=trial.skills, skills_dir=trial.skills_dir)


def recording_settings(given: RolloutSettings, trial: TrialConfig | None) -> RolloutSettings:
    """The settings of a new recording of `trial` (None: a plain run): `given` (the CLI's, a job
    file's, the Python API's), and for each field `given` leaves out (None), the trial file's;
    backend settings given without a backend parsed by the default backend's model.

    Raises:
        SandboxBackendError: as `UnboundSandboxConfig.bound`.
    """
    if isinstance(given.sandbox_config, UnboundSandboxConfig):
        bound = given.sandbox_config.bound(given.sandbox or DEFAULT_SANDBOX)
        given = given.model_copy(update={"sandbox_config": bound})
    if trial is None:
        return given
    from_trial = trial_settings(trial)
    update = {
        name: getattr(from_trial, name)
        for name in from_trial.model_fields_set
        if getattr(given, name) is None and getattr(from_trial, name) is not None
    }
    return given.model_copy(update=update)


def recorded_settings(config: RunConfig) -> RolloutSettings:
    """The settings a recorded run ran with, read from its config.json (`config`): what a rollout
    from a checkpoint of it inherits (`continuation_settings`). Its learner store comes read-only
    (a continuation never writes back); its skills folder only when it was a ``--skills-dir``; its
    backend's settings parsed by that backend's model (call `reroll.rollout.trust.refuse_untrusted`
    first: an out-of-tree backend is imported).

    Raises:
        SandboxBackendError: the recorded backend is unknown or refuses the recorded settings.
    """
    store = config.learner_store
    custom = config.skill_source == "custom_runtime" and config.effective_skills_dir is not None
    return RolloutSettings(
        timeout_seconds=config.timeout_sec or None,
        sandbox=config.sandbox,
        sandbox_config=load_backend(config.sandbox).settings(config.sandbox_config),
        network=config.network,
        environment_manifest=Path(config.environment_manifest) if config.environment_manifest else None,
        environment_services=tuple(config.environment_services) if config.environment_services else None,
        learner_store=store.model_copy(update={"writes_back": False}) if store is not None else None,
        skill_mode=config.skill_mode,
        skills_dir=Path(config.effective_skills_dir) if custom and config.effective_skills_dir else None,
        judge_model=config.judge_model,
        ask_user=config.ask_user,
        without_mcp=config.without_mcp,
        user_model=config.user_model,
    )


def continuation_settings(recorded: RolloutSettings, given: RolloutSettings) -> RolloutSettings:
    """The settings of a rollout from a checkpoint of a run that ran with `recorded`, given `given`:
    each field by its `Carry`. Idempotent: deriving from the result again changes nothing.

    Two fields depend on others: the original's ``sandbox_config`` is kept only on its backend
    (`Carry.MERGED`; settings given without a backend are parsed by that of the rollout), and its
    ``skills_dir`` only when the rollout runs ``with-skill``.

    Raises:
        SandboxBackendError: as `UnboundSandboxConfig.bound`.
    """
    update: dict[str, Any] = {}
    for name in RolloutSettings.model_fields:
        mine, theirs = getattr(given, name), getattr(recorded, name)
        carry = carry_of(name)
        if carry is Carry.OVERRIDABLE:
            update[name] = theirs if mine is None else mine
        elif carry is Carry.MERGED:
            update[name] = _merged_sandbox_config(recorded, given)
        else:
            update[name] = mine
    if given.skills_dir is None and update["skill_mode"] != "with-skill":
        update["skills_dir"] = None
    if (store := update["learner_store"]) is not None:
        update["learner_store"] = store.model_copy(update={"writes_back": False})
    return given.model_copy(update=update)


def _merged_sandbox_config(recorded: RolloutSettings, given: RolloutSettings) -> BaseModel | None:
    """The backend settings of a continuation (`Carry.MERGED`): `given`'s over `recorded`'s key by
    key on the original's backend, `given`'s alone on another; each parsed by the model of the
    backend the rollout runs on when it was given without one (`UnboundSandboxConfig`)."""
    backend = given.sandbox or recorded.sandbox or DEFAULT_SANDBOX
    theirs = recorded.sandbox_config if given.sandbox in (None, recorded.sandbox) else None
    if isinstance(theirs, UnboundSandboxConfig):
        theirs = theirs.bound(backend)
    mine = given.sandbox_config
    if isinstance(mine, UnboundSandboxConfig):
        return mine.bound(backend, theirs)
    return theirs if mine is None else over_settings(theirs, mine)


def with_recorded_inputs(given: RolloutSettings, original: RunConfig) -> RolloutSettings:
    """`given` of a continuation or branch of the run whose config.json is `original`, with the host
    paths the rollout would take from that config bound in them (`continuation_settings`), so every
    host path it reads is in `RolloutSettings.paths_read` and an executor on another machine can
    carry it there (`reroll.jobs.ray_executor`). A judge's or User's model is bound only when it
    names a script file (made absolute, `reroll.models.spec.resolved_spec`); a persona User's
    falls back to the trial's persona's own ``model`` when that is a script file."""
    persona = original.trial.persona if original.trial is not None else None
    persona_model = persona.model if persona is not None else None
    derived = continuation_settings(recorded_settings(original), given)
    return derived.model_copy(
        update={
            "judge_model": _script_or(given.judge_model, original.judge_model),
            "user_model": _script_or(given.user_model, original.user_model, persona_model),
        }
    )


def _script_or(given: str | None, *recorded: str | None) -> str | None:
    """`given` made absolute (`resolved_spec`), else the first of `recorded` that is a script file
    (a provider's model names no host path, so it is left to the rollout's own default)."""
    if given is not None:
        return resolved_spec(given)
    return next((spec for spec in recorded if spec is not None and script_file(spec)), None)
