"""The run folder: what one rollout leaves on disk (format in DESIGN.md, compatible with BenchFlow's).

::

    <jobs-dir>/<job>/<rollout>/
      config.json                      RunConfig: what was run; continued_from / branched_from provenance
      result.json                      RunResult: status, rewards (and verify_result), timings, counts, error
      prompts.json                     every prompt sent to the agents, in order (a JSON list of strings)
      trial.json                       the trial's turns: place, prompt, how each ended (a TrialRecord)
      trajectory/llm_trajectory.jsonl  one LLM exchange per line (`reroll_contracts.trajectory`)
      trajectory/judge_trajectory.jsonl  a judge's exchanges, same format (`reroll.rollout.verify.judge`,
                                         `reroll.rollout.verify.agent_judge`)
      trajectory/user_trajectory.jsonl   a persona User's exchanges, same format
                                         (`reroll.rollout.turns.persona`)
      asks.json                        the agent's ask_user questions and answers (`reroll.runfolder.asks`)
      verifier/                        the verifier's output and logs
      agent/output.log                 the agent's console output
      workspace_manifest.json          sha256 of every workspace file when the agent stopped
      error.txt                        the traceback of a bug that ended the rollout, if one did
      fidelity.json                    ``reroll replay``'s report, in the rebuilt run folder
      services/                        the environment's services: <name>.log (each one's output,
                                       entrypoint.log for an image that owns its lifecycle) and
                                       services.json (`ServiceRecord`s: started, ready, exited)
      harness/                         controller.log, proxy.json (the proxy's config, with the rollout
                                       token), ready files, logs: mode 0700, token files 0600;
                                       judge/, persona/, agent-judge/: the side parts' own;
                                       restored-checkpoint.json, checkpoint-holds.json,
                                       replayed-remainder.jsonl (a fork's, a checkpointed run's)
      checkpoints/step-K/              the checkpoints captured while it ran (``--checkpoint-every``)

Every name above is a constant of this module (the files features write into ``verifier/``,
``checkpoints/step-K/`` and ``services/`` are `reroll.runfolder.paths`'s, the job folder and the
branch tree `reroll.runfolder.folders` and `reroll.runfolder.summary`); every path is asked of
`reroll.runfolder.paths.RunPaths`, never joined by hand outside this package. Folders written by
BenchFlow load too: fields reroll adds are optional, and a result.json without ``status`` gets one
from ``error_category``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reroll_contracts.errors import RunFolderError
from reroll_contracts.faults import FaultsUsed
from reroll_contracts.network import NetworkPolicy, PhaseNetworks
from reroll_contracts.reward import VerifyResult
from reroll_contracts.trajectory import Exchange, LoadedTrajectory, load_trajectory, read_capped

from reroll.trials.config import DEFAULT_SKILL_MODE, SkillMode, SkillNudge, SkillSource, TrialConfig

CONFIG_FILE = "config.json"
RESULT_FILE = "result.json"
PROMPTS_FILE = "prompts.json"
TRAJECTORY_DIR = "trajectory"
TRAJECTORY = Path(TRAJECTORY_DIR) / "llm_trajectory.jsonl"
JUDGE_TRAJECTORY = Path(TRAJECTORY_DIR) / "judge_trajectory.jsonl"
"""An LLM judge's exchanges, in the agent trajectory's format (`reroll.rollout.verify.judge`); an agent
judge's, appended from its own run folder (`reroll.rollout.verify.agent_judge`)."""
USER_TRAJECTORY = Path(TRAJECTORY_DIR) / "user_trajectory.jsonl"
"""A persona User's model's exchanges (`reroll.rollout.turns.persona`), in the agent's exchange format."""
SIDE_TRAJECTORIES: dict[str, Path] = {"judge": JUDGE_TRAJECTORY, "user": USER_TRAJECTORY}
"""The trajectories of the models beside the agent's, by who spoke to them: ``judge`` (an LLM or
agent judge) and ``user`` (a persona User). `load_run_folder` loads those present into
`RunFolder.sides`; `reroll view` shows them and ``reroll export`` carries them."""
SIDE_LABELS: dict[str, str] = {"judge": "judge", "user": "persona"}
"""What the CLI and `reroll view` call each side trajectory's model."""
VERIFIER_DIR = "verifier"
AGENT_DIR = "agent"
AGENT_LOG = Path(AGENT_DIR) / "output.log"
MANIFEST_FILE = "workspace_manifest.json"
ERROR_FILE = "error.txt"
"""The traceback of an exception outside reroll's tree that ended the rollout."""
LIMITS_FILE = "limits.txt"
"""The limits of the task's ``environment`` lowered to what the host has (one line each; absent
when none was): ``reroll.tasks.variants.capped_to_host``."""
FIDELITY_FILE = "fidelity.json"
SERVICES_DIR = Path("services")
"""The task's services' logs (``<name>.log``) and `SERVICES_FILE` (`reroll.environment.services`)."""
SERVICES_FILE = SERVICES_DIR / "services.json"
"""A JSON list of `ServiceRecord`: when each service started, was ready and exited."""
HARNESS_DIR = Path("harness")
"""What reroll's own processes leave: their configs, ready files and logs; only their owner (root,
for a root controller) may enter it."""
CONTROLLER_LOG = HARNESS_DIR / "controller.log"
"""Where a rollout started without a console writes its progress."""
PROXY_CONFIG = HARNESS_DIR / "proxy.json"
"""The LLM proxy's config (`reroll_contracts.proxy.ProxyConfig`): a later replay reads its
recorded sandbox values (`reroll.host.llm_proxy.recorded_sandbox_values`)."""
CHECKPOINTS_DIR = "checkpoints"
"""In a run folder: the checkpoints captured while it ran (``--checkpoint-every``,
`reroll.rollout.extensions.checkpoints`), ``step-K/`` each."""
RESTORED_FILE = "restored-checkpoint.json"
"""In ``harness/`` of a rollout forked from checkpoint layers: the checkpoint it restored (its
layers' digests, which the restore reproduced)."""
HELD_FILE = "checkpoint-holds.json"
"""In ``harness/`` of a run that took checkpoints: ``{"steps": [K...], "seconds": [...], "capture":
[...]}``, how long each step's request was held for its checkpoint, as the proxy measured it (from
the hold to the release, or to the end of its own freeze: the per-step cost the agent waits), and
how much of it went to capturing (the rest: the hold's news reaching the controller and the
release reaching the proxy; none when the proxy froze)."""
REMAINDER_FILE = "replayed-remainder.jsonl"
"""In ``harness/`` of a rollout forked from an earlier step's layers
(`reroll.rollout.origin.FromCheckpoint.layers_step`): the recorded exchanges from that step to the
cut, which its proxy replays before it goes live."""
MAX_JSON_BYTES = 64 * 1024 * 1024
"""The largest config.json, result.json or prompts.json read."""
CONTINUABLE_CATEGORIES = ("timeout", "idle_timeout")
Status = Literal["ok", "timeout", "error"]


def now_iso() -> str:
    """The current UTC time, ISO 8601 with microseconds."""
    return datetime.now(UTC).isoformat()


class ContinuedFrom(BaseModel):
    """Provenance of a continued run."""

    path: str
    """Resolved absolute path of the original run folder."""
    status: str
    """The original run's status (``timeout`` for the main use)."""
    cut_index: int
    """Number of recorded exchanges replayed before the live model took over."""
    at: str | None = None
    """The checkpoint as given with ``--at`` (a step or a fraction), None when the cut is the end
    of the recording."""
    original_model: str | None
    """The model the original run used."""
    live_model: str | None
    """The model used after the cut (None with ``--replay-only``)."""
    replay_only: bool = False
    """True when the continuation stopped at the cut point."""


class BranchedFrom(ContinuedFrom):
    """Provenance of a branch: in the tree's parent folder (the shared prefix) `path` is the run
    branched from; in each child run folder it is the parent folder."""

    branch_index: int | None = None
    """Which continuation of `live_model` the child is (0-based); None in the parent folder."""
    prompt: str | None = None
    """The prompt the child was given for the turn its cut starts (``branch --prompt``), instead
    of the recorded one."""
    answer: str | None = None
    """The answer the child was given to the recorded ask_user question at its cut
    (``branch --at-ask``), instead of the recorded one."""
    via: Literal["snapshot", "replay"] = "replay"
    """How the child reached the cut: forked from the tree's checkpoint layers (its trajectory
    then holds only the exchanges after the cut; the prefix is the parent's) or by replaying."""


class StoreUse(BaseModel):
    """config.json's ``learner_store``: the generation of a job's learner store the rollout started
    from (`reroll.runfolder.store`; a ``sequential-shared`` job's rollout, or a continuation or
    branch of one)."""

    model_config = ConfigDict(extra="forbid")
    path: str
    """The store folder (absolute): ``<job>/store``."""
    generation: int = Field(ge=0)
    """The generation mounted into the sandbox."""
    writes_back: bool
    """True: the store as the agent left it becomes the job's next generation (a job's rollout);
    False: nothing goes back to the store (a continuation or branch: read-only to the store)."""


class StoreHarvest(BaseModel):
    """result.json's ``learner_store``: the learner store as the agent left it (a rollout whose
    `StoreUse` writes back); its job commits it as the next generation."""

    model_config = ConfigDict(extra="forbid")
    files: dict[str, str]
    """``{path relative to the store: sha256 hex}`` of its regular files, sorted; the contents are
    blobs of the store (``objects/``)."""
    left_out: list[str] = Field(default_factory=list)
    """What was not taken, each ``path: why`` (a symlink, a FIFO, a file over the size limit)."""


class RescoredFrom(BaseModel):
    """Provenance of a re-scored run (``reroll rescore``): the workspace rebuilt by replay, the
    verifier run again."""

    path: str
    """Resolved absolute path of the original run folder."""
    judge_model: str | None
    """The judge model asked live; None: the original's recorded judge answers were replayed."""


class RunConfig(BaseModel):
    """config.json: what was run."""

    model_config = ConfigDict(extra="allow")
    task_path: str
    task_name: str | None = None
    agent: str
    model: str | None = None
    timeout_sec: float | None = None
    max_steps: int | None = None
    """The step limit (``--max-steps``, `reroll.settings.RolloutSettings.max_steps`); None: none."""
    agent_env: dict[str, str] = Field(default_factory=dict)
    started_at: str | None = None
    lineage_started_at: str | None = None
    """When the first recording of this run's lineage started (ISO 8601): the same in every
    continuation, replay and branch of it, and the agent's git author/committer date
    (`reroll.rollout.agent_phase.stable_agent_env`). None in folders written before it existed (and by
    BenchFlow): ``started_at`` stands in."""
    sandbox: str = "local"
    sandbox_config: dict[str, Any] = Field(default_factory=dict)
    """The settings of the sandbox backend as given (``--sandbox-config``, ``--image-map``, a job
    file's), validated by the backend's config model (`reroll.sandbox.base.Backend`); a
    continuation, replay or branch on the same backend starts from them."""
    network: NetworkPolicy | None = None
    """The run's network policy override (``--network``); None: the task's ``environment.network``."""
    network_phases: PhaseNetworks | None = None
    """The network policy each phase ran with (the task's, the override applied); None in folders
    written before it was recorded."""
    environment_manifest: str | None = None
    """The environment manifest the run bound instead of the task's own (``--environment-manifest``,
    ``--state``: a host file); None: the task's."""
    environment_services: list[str] | None = None
    """The only services of the environment it started (``--state``'s ``tools``); None: all."""
    reroll_version: str | None = None
    continued_from: ContinuedFrom | None = None
    branched_from: BranchedFrom | None = None
    faults: FaultsUsed | None = None
    """The fault plan injected by the proxy, if any."""
    judge_model: str | None = None
    """An LLM judge's model as given (``--judge-model``); None: the task's."""
    user_model: str | None = None
    """A persona User's model as given (``--user-model``, `reroll.rollout.turns.persona`); None: the
    trial's persona's ``model``."""
    rescored_from: RescoredFrom | None = None
    trial: TrialConfig | None = None
    """The scenes, roles and turns run (`reroll.trials.config`, resolved), when they are more than the one
    prompt of a plain run; None: ``agent`` told the task's instruction once."""
    learner_store: StoreUse | None = None
    """The learner store generation mounted (a ``sequential-shared`` job's rollout, or a
    continuation or branch of one); None: no store."""
    skill_mode: SkillMode = DEFAULT_SKILL_MODE
    """How the agents got skills (BenchFlow's field; `reroll.trials.config.SkillMode`)."""
    skill_source: SkillSource = "none"
    """Where the skills came from (BenchFlow's field and values): ``task_bundled`` (the task's
    ``environment/skills``), ``custom_runtime`` (``--skills-dir``), ``self_generated``, ``none``."""
    effective_skills_dir: str | None = None
    """The host folder of the skills mounted (BenchFlow's field); for ``self-gen``, reroll's
    bundled skill-creator; None: none mounted."""
    skills: dict[str, str] = Field(default_factory=dict)
    """The skills of `effective_skills_dir` by name → sha256 of their files
    (`reroll.tasks.skills.Skill.digest`)."""
    skill_nudge: SkillNudge | None = None
    """The prompt nudge layered on top (``$REROLL_SKILL_NUDGE`` or ``$BENCHFLOW_SKILL_NUDGE`` when
    the run started); None: none."""
    ask_user: bool = False
    """The agent was offered reroll's ``ask_user`` tool over MCP (``reroll run --ask-user``); its
    questions and the answers are in asks.json (`reroll.runfolder.asks`). Its continuations and
    branches offer it too."""
    without_mcp: bool = False
    """The agents ran without the task's MCP servers (``reroll run --without-mcp``: a baseline;
    result.json's ``mcp_withheld`` names them). Its continuations and branches run without them too."""


class Timings(BaseModel):
    """Durations of the rollout's phases, in seconds."""

    setup_seconds: float | None = None
    agent_seconds: float | None = None
    verifier_seconds: float | None = None
    total_seconds: float | None = None


class ServiceRecord(BaseModel):
    """One service of the task's environment in a rollout (`SERVICES_FILE`); times are Unix
    seconds (wall clock), None for what did not happen."""

    name: str
    """The service's name (``entrypoint`` for the image's own entrypoint, ``owns_lifecycle``)."""
    runs: Literal["command", "image"]
    """``command``: a process inside the sandbox; ``image``: a sibling container (docker)."""
    probe: str
    """Its readiness probe, as a phrase."""
    log: str
    """Its log, relative to the run folder (``services/<name>.log``)."""
    started_at: float | None = None
    ready_at: float | None = None
    """When its probe first passed (the agent starts after every service's)."""
    exited_at: float | None = None
    """When it was seen exited before the teardown (a crash, or a failed start)."""
    exit_code: int | None = None
    skipped: str | None = None
    """Why it was not started (``if_installed``: its program does not run in this sandbox)."""


class Counts(BaseModel):
    """The exchanges in the rollout's trajectory: what the agent received, by source."""

    exchanges: int = 0
    replayed: int = 0
    live: int = 0
    divergences: int = 0
    tokens: int | None = None
    """``usage.total_tokens`` summed over the recorded responses (0 when none reported usage);
    None when not counted: in result.json files of earlier versions, and before the count."""


class RunResult(BaseModel):
    """result.json: how the rollout ended."""

    model_config = ConfigDict(extra="allow")
    status: Status | None = None
    rewards: dict[str, float] | None = None
    """BenchFlow's flat rewards: ``{"reward": x, ...}``."""
    verify_result: VerifyResult | None = None
    """The structured form of the rewards (items, events with their step, space, granularity),
    when the verifier gave one (`reroll_contracts.reward`)."""
    error: str | None = None
    error_category: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    timings: Timings = Field(default_factory=Timings)
    counts: Counts = Field(default_factory=Counts)
    learner_store: StoreHarvest | None = None
    """The learner store when the agent stopped, for a rollout whose store writes back; None
    otherwise, or when the rollout failed before the store was read."""
    skills_opened: list[str] | None = None
    """The mounted skills the agents opened (read a file of, or invoked), from the tool calls of
    the recorded exchanges (`reroll.tasks.skills.skills_opened`); None: no skill was mounted."""
    skills_generated: dict[str, str] | None = None
    """``self-gen``: the skills the creator scene wrote, by name → sha256 of their files."""
    mcp_withheld: list[str] | None = None
    """``--without-mcp`` (config.json's ``without_mcp``): the task's MCP servers the agents were not
    offered, by name; None: the run offered them (or the task has none)."""
    judge_counts: Counts | None = None
    """An LLM or agent judge's exchanges (`JUDGE_TRAJECTORY`) by source, the divergent ones (a replayed
    judge request that differs from the recording) and tokens; None without a judge."""
    user_counts: Counts | None = None
    """A persona User's exchanges (`USER_TRAJECTORY`), as `judge_counts`; None without one."""

    def side_counts(self) -> dict[str, Counts]:
        """The counts of the side trajectories the run has, by their key in `SIDE_TRAJECTORIES`."""
        counts = {"judge": self.judge_counts, "user": self.user_counts}
        return {side: count for side, count in counts.items() if count is not None}

    @property
    def effective_status(self) -> Status | Literal["unknown"]:
        """`status`; for BenchFlow's files (which have none) the one `error_category` implies.

        ``unknown`` when reroll wrote ``status: null``: the rollout was interrupted before it ended
        (a cancelled job), so nothing says how it went.
        """
        if self.status is not None:
            return self.status
        if "status" in self.model_fields_set:
            return "unknown"
        if self.error_category in CONTINUABLE_CATEGORIES:
            return "timeout"
        return "error" if self.error else "ok"


class RunFolder(BaseModel):
    """A loaded run folder."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    path: Path
    config: RunConfig
    result: RunResult | None
    prompts: list[str]
    trajectory: LoadedTrajectory
    sides: dict[str, LoadedTrajectory] = Field(default_factory=dict)
    """The side trajectories present (`SIDE_TRAJECTORIES`: ``judge``, ``user``), by that key;
    empty unless loaded with ``sides=True``."""

    @property
    def exchanges(self) -> list[Exchange]:
        """The recorded exchanges, in order."""
        return self.trajectory.exchanges

    def side_counts_json(self) -> dict[str, dict[str, int]]:
        """result.json's counts of the side trajectories (`RunResult.side_counts`) as JSON; empty
        without a result."""
        counts = self.result.side_counts() if self.result is not None else {}
        return {side: count.model_dump(mode="json") for side, count in counts.items()}


def count_exchanges(trajectory: LoadedTrajectory) -> Counts:
    """Count a trajectory's exchanges by ``metadata.source``, those with a divergence, and the
    tokens their responses report."""
    exchanges = trajectory.exchanges
    replayed = sum(1 for exchange in exchanges if exchange.metadata.source == "replayed")
    return Counts(
        exchanges=len(exchanges),
        replayed=replayed,
        live=len(exchanges) - replayed,
        divergences=sum(1 for exchange in exchanges if exchange.metadata.divergence is not None),
        tokens=sum(map(response_tokens, exchanges)),
    )


def response_tokens(exchange: Exchange) -> int:
    """The ``usage.total_tokens`` the exchange's response body reports; 0 when it reports none."""
    body = exchange.response.body
    usage = body.get("usage") if isinstance(body, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and not isinstance(total, bool) else 0


def load_run_folder(path: Path, *, sides: bool = False) -> RunFolder:
    """Load a run folder written by reroll or BenchFlow; with `sides`, its side trajectories too
    (`SIDE_TRAJECTORIES`: what `reroll view` and ``reroll export`` show; a command that reruns the
    agent reads them where it needs them, so a corrupt judge file never stops a continuation).

    A truncated last trajectory line (a run killed mid-write) is tolerated: it is ignored and
    reported in ``trajectory.warning`` (a side trajectory's in its own ``warning``). The side
    trajectories (`SIDE_TRAJECTORIES`) are optional. A missing result.json is tolerated too (a run
    killed before it finished); its status then reads as unknown (`result` is None).

    Raises:
        RunFolderError: the folder, config.json, prompts.json or the trajectory is missing, or
            any of them (or a side trajectory) is corrupt, unreadable, a symlink or below one
            (never followed out of the folder), not a regular file (a FIFO) or larger than its
            cap; the message names the file (and the line, for a trajectory).
    """
    try:
        path = path.resolve(strict=True)
    except FileNotFoundError:
        raise RunFolderError(f"run folder not found: {path}") from None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise RunFolderError(f"run folder {path}: cannot be resolved ({exc})") from exc
    if not path.is_dir():
        raise RunFolderError(f"run folder not found: {path}")
    config: RunConfig = _validated(
        RunConfig, read_json_file(path / CONFIG_FILE, required=True, root=path), path / CONFIG_FILE
    )
    raw_result = read_json_file(path / RESULT_FILE, required=False, root=path)
    result: RunResult | None = (
        _validated(RunResult, raw_result, path / RESULT_FILE) if raw_result is not None else None
    )
    prompts = read_json_file(path / PROMPTS_FILE, required=True, root=path)
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise RunFolderError(f"{path / PROMPTS_FILE}: expected a JSON list of strings")
    try:
        trajectory = load_trajectory(path / TRAJECTORY, root=path)
    except FileNotFoundError as exc:
        raise RunFolderError(
            f"{path / TRAJECTORY}: missing (not a run folder, or nothing was recorded)"
        ) from exc
    loaded_sides = {}
    for side, file in SIDE_TRAJECTORIES.items() if sides else ():
        try:
            loaded_sides[side] = load_trajectory(path / file, root=path)
        except FileNotFoundError:
            continue
    return RunFolder(
        path=path, config=config, result=result, prompts=prompts, trajectory=trajectory, sides=loaded_sides
    )


def load_manifest(run_dir: Path) -> dict[str, str] | None:
    """The run's workspace manifest (``{relative path: sha256 hex or a kind}``); None when it has none.

    Raises:
        RunFolderError: the file is not a JSON object, or unreadable or too large (the message names it).
    """
    file = run_dir / MANIFEST_FILE
    data = read_json_file(file, required=False, root=run_dir)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise RunFolderError(f"{file}: expected a JSON object of path → sha256")
    return {str(key): str(value) for key, value in data.items()}


def read_json_file(file: Path, *, required: bool, root: Path | None = None) -> Any:
    """The JSON in `file`, a file of a run folder (`root`, when given: no symlink below it is
    followed), read with `reroll_contracts.datafile.read_data_file` under `MAX_JSON_BYTES`; None
    when it is missing and not `required`.

    Raises:
        RunFolderError: missing (when `required`), unreadable, a symlink, not a regular file (a
            FIFO), larger than `MAX_JSON_BYTES`, or not JSON; the message names the file.
    """
    try:
        data = orjson.loads(read_capped(file, MAX_JSON_BYTES, root=root))
    except FileNotFoundError as exc:
        if not required:
            return None
        raise RunFolderError(f"{file}: missing") from exc
    except OSError as exc:
        raise RunFolderError(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise RunFolderError(f"{file}: invalid JSON: {exc}") from exc
    except ValueError as exc:  # not a regular file, or too large
        raise RunFolderError(f"{file}: {exc}") from exc
    return data


def _validated(model: type[BaseModel], data: Any, file: Path) -> Any:
    """Validate `data` as `model`, converting errors to RunFolderError naming `file`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RunFolderError(f"{file}: invalid content:\n{exc}") from exc


def write_json(file: Path, data: BaseModel | list[Any] | dict[str, Any]) -> None:
    """Write JSON atomically (temp file + rename), pretty-printed, fsynced."""
    payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
    write_bytes_atomically(file, [orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n"])


def write_bytes_atomically(file: Path, pieces: Iterable[bytes]) -> None:
    """Write `pieces` one after the other to `file` atomically (temp file beside it + rename), fsynced.

    If producing a piece raises, `file` is left as it was and the temp file removed.
    """
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    try:
        with open(tmp, "wb") as out:
            for piece in pieces:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, file)


def create_run_folder(parent: Path, name: str) -> Path:
    """Create a new, empty run folder ``parent/name`` — never reusing an existing one.

    If ``name`` is taken, ``name-2``, ``name-3``, … is used instead, so nothing is written over.
    """
    parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        candidate = parent / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        (candidate / TRAJECTORY_DIR).mkdir()
        return candidate
    raise RunFolderError(f"{parent}: could not find a free folder name for {name}")


def harness_folder(run_dir: Path) -> Path:
    """``run_dir/harness``, created if missing, mode 0700 (also when it existed).

    It holds the proxy's config with the rollout token (``harness/proxy.json``): an agent of
    another rollout that can see this run folder (a local sandbox with ``--network full``) must
    not read it and call this rollout's proxy.

    Raises:
        OSError: the folder cannot be created or its mode set.
    """
    folder = run_dir / HARNESS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    return folder


HarnessPart = Literal["judge", "persona", "agent-judge"]
"""A part of the rollout with a working folder of its own under ``harness/``: the llm-judge's
recording proxy (`reroll.rollout.verify.judge`), a persona User's
(`reroll.rollout.turns.persona`), the agent judge's rollouts (`reroll.rollout.verify.agent_judge`)."""


def harness_part(run_dir: Path, part: HarnessPart) -> Path:
    """``run_dir/harness/<part>``: `part`'s working folder, below `harness_folder` (created, mode
    0700); the part's folder itself is not created.

    Raises:
        OSError: ``harness/`` cannot be created or its mode set.
    """
    return harness_folder(run_dir) / part


def write_private(file: Path, data: bytes) -> None:
    """Write `data` to `file`, mode 0600 (also when it existed), not following a symlink at `file`.

    Raises:
        OSError: the file cannot be written (e.g. `file` is a symlink: ELOOP).
    """
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb") as out:
        os.fchmod(fd, 0o600)
        out.write(data)
