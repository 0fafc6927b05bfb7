"""The flags of `reroll.settings.RolloutSettings`, declared once for every command, and the one
function that turns them into the settings (`rollout_settings`).

A command declares the flags it honours with the option types below (a parameter named as in
`FLAGS`) and passes its parameters to `rollout_settings` (``rollout_settings(locals())`` on its
first line): no command builds the settings field by field. The flags of sandboxes are uniform:
every command that starts sandboxes takes ``--sandbox``, ``--sandbox-config``, ``--image-map`` and
``--network``; the fault and divergence flags where they mean something (a command that leaves
one out says why in its help).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, RerollError
from reroll_contracts.network import NetworkPolicy
from reroll_contracts.proxy import DivergencePolicy

from reroll.cli.common import err_console, refuse
from reroll.sandbox.docker.config import parse_image_map
from reroll.tasks.manifest import parse_state, resolve_manifest
from reroll.trials.config import SkillMode

if TYPE_CHECKING:
    from reroll_contracts.faults import FaultsUsed

    from reroll.settings import RolloutSettings

TimeoutOption = Annotated[
    float | None,
    typer.Option(
        help="The agent's wall-clock budget in seconds [default: the original's (a run continued, "
        "branched or replayed), else the task's]."
    ),
]
SandboxOption = Annotated[
    str | None,
    typer.Option(
        help="Sandbox backend: local (isolated by namespaces), local-plain, docker, or a dotted path "
        "(package.module:Class)."
    ),
]
SandboxConfigOption = Annotated[
    str | None,
    typer.Option(
        help="Settings of the sandbox backend, a JSON object checked by the backend's config "
        "model, e.g. '{\"ready_timeout_seconds\": 120}' (see docs/sandboxes.md)."
    ),
]
ImageMapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--image-map",
        help="Build a task's Dockerfile FROM a local image instead: SRC=DST, e.g. "
        "ubuntu:20.04=reroll/debian:bookworm-python (repeatable; docker, and local on a task's "
        "image; no registry needed; a catalogue image reroll/debian:VARIANT is built on first use; "
        "= the setting image_map).",
    ),
]
NetworkOption = Annotated[
    NetworkPolicy | None,
    typer.Option(help="Egress: none (only the LLM proxy; local or docker) or full [default: the task's]."),
]
FaultsOption = Annotated[
    Path | None,
    typer.Option(
        help="Fault plan (YAML) the LLM proxy injects: status errors, latency, stalls, cuts, resets."
    ),
]
FaultSeedOption = Annotated[
    int | None, typer.Option(help="Seed of the fault plan's probability draws [default: the plan's seed].")
]
OnDivergenceOption = Annotated[
    DivergencePolicy | None,
    typer.Option(
        help="When a replayed request differs from the recording: warn (serve it anyway), strict "
        "(abort), cutover (go live) [default: warn].",
    ),
]
StrictDivergenceOption = Annotated[
    bool, typer.Option(help="Abort if replay leaves the recorded rails (= --on-divergence strict).")
]
SkillsOption = Annotated[
    SkillMode | None,
    typer.Option(
        "--skills",
        help="Skill mode: no-skill (the task's environment/skills hidden), with-skill (mounted at each "
        "agent's native skill paths), self-gen (a creator scene writes the skills the solver gets) "
        "[default: the original's, else the trial's, else no-skill]. "
        "$REROLL_SKILL_NUDGE=name|description|full also names them in the prompt.",
    ),
]
SkillsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--skills-dir",
        help="with-skill: mount this folder of <name>/SKILL.md instead of the task's environment/skills.",
    ),
]
JudgeModelOption = Annotated[
    str | None,
    typer.Option(
        help="A judge's model (a --model spec) for a task scored by llm-judge or agent-judge "
        "[default: the task's]."
    ),
]
UserModelOption = Annotated[
    str | None,
    typer.Option(
        help="A persona User's model (a --model spec; a trial scene's `persona`) [default: the "
        "original's, else the persona's `model`]; recorded answers before a cut are replayed, not asked."
    ),
]
TrustOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trust",
        help="Host code the run folder's config.json names that you reviewed and run again: a "
        "trial User's file (path/to/user.py) or module, an out-of-tree sandbox backend "
        "(repeatable). A run folder is data: without it, reroll refuses to import what it names.",
    ),
]
AskUserOption = Annotated[
    bool | None,
    typer.Option(
        "--ask-user",
        help="Offer the agent an ask_user tool (over MCP: claude-code, codex, openhands); the trial's "
        "User answers (its `answer` method; a job's rollouts have none: the agent is told nobody "
        "answered), the questions and answers go to asks.json.",
    ),
]
WithoutMcpOption = Annotated[
    bool | None,
    typer.Option(
        "--without-mcp",
        help="Run the agent without the task's MCP servers (its services still run): a baseline "
        "that scores what the agent reaches without those tools (an agent with no MCP client "
        "otherwise gets them through reroll's mcp-call bridge); config.json and result.json say so.",
    ),
]
CheckpointEveryOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Capture a checkpoint (environment state, workspace, agent session) every N steps, "
        "into <run>/checkpoints/step-K/: `reroll branch --at K --via snapshot` forks from it "
        "without rebuilding the prefix [default: 0, none].",
    ),
]
CheckpointKeepOption = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Keep a copy-on-write pool checkpoint at every step (local with btrfs), at most N: all "
        "for a run of up to N steps, beyond that the latest N/2 and the earlier ones thinned to an "
        "even stride (`reroll branch --at K` starts from the nearest earlier one); 0: off "
        "[default: 64].",
    ),
]

EnvironmentManifestOption = Annotated[
    str | None,
    typer.Option(
        "--environment-manifest",
        help="Bind this environment manifest instead of the task's own (BenchFlow's): a file "
        "(environment.toml / .yaml), or NAME[@VERSION] in the folder $BENCHFLOW_ENV_REGISTRY names "
        "[default: the original's, else the task's].",
    ),
]
StateOption = Annotated[
    str | None,
    typer.Option(
        "--state",
        help='The environment bound, BenchFlow\'s S axis: JSON {"name": MANIFEST, "tools": [SERVICE, ...]} '
        "(only those services start) or a MANIFEST as --environment-manifest takes; wins over it.",
    ),
]
MaxStepsOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Cut the run once it served N steps (model requests; a continuation's replayed ones "
        "count): it ends as timeout (category step_limit), is verified, and `reroll continue` "
        "takes it [default: no limit].",
    ),
]

FLAGS: dict[str, str] = {
    "timeout": "timeout_seconds",
    "max_steps": "max_steps",
    "sandbox": "sandbox",
    "sandbox_config": "sandbox_config",
    "image_map": "sandbox_config",
    "network": "network",
    "environment_manifest": "environment_manifest",
    "state": "environment_services",
    "faults": "faults",
    "fault_seed": "faults",
    "on_divergence": "divergence_policy",
    "strict_divergence": "divergence_policy",
    "skills": "skill_mode",
    "skills_dir": "skills_dir",
    "judge_model": "judge_model",
    "user_model": "user_model",
    "ask_user": "ask_user",
    "without_mcp": "without_mcp",
    "checkpoint_every": "checkpoint_every",
    "checkpoint_keep": "checkpoint_keep",
    "trust": "trust",
}
"""Each settings flag (a command's parameter name) → the `RolloutSettings` field it sets."""


def rollout_settings(flags: Mapping[str, Any]) -> RolloutSettings:
    """The settings a command's flags give: `flags` are its parameters by name (``locals()``);
    those of `FLAGS` set their field, the others are ignored, and a flag not given sets nothing.

    Bad flags are printed and exit with code 2: ``--fault-seed`` without ``--faults``, a fault plan
    or a ``--sandbox-config`` that cannot be read, conflicting divergence flags, a value the
    settings model refuses, a backend's setting its config model refuses (with ``--sandbox``;
    without it, the backend the rollout runs on parses them, `reroll.settings.UnboundSandboxConfig`).
    """
    from reroll.settings import RolloutSettings  # the models, sandboxes and proxy: not for a help

    given: dict[str, Any] = {
        FLAGS[name]: value for name, value in flags.items() if name in FLAGS and value is not None
    }
    given["faults"] = faults_from_flags(flags.get("faults"), flags.get("fault_seed"))
    given["sandbox_config"] = sandbox_settings(flags.get("sandbox_config"), flags.get("image_map"))
    given |= environment_binding(flags.get("environment_manifest"), flags.get("state"))
    given["divergence_policy"] = divergence_policy(
        flags.get("on_divergence"), bool(flags.get("strict_divergence"))
    )
    try:
        return RolloutSettings.model_validate(given)  # the backend's settings parsed, when it is named
    except RerollError as exc:
        refuse(exc)
    except ValidationError as exc:
        err_console.print(f"[red]error:[/red] the command line: invalid flags:\n{exc}")
        raise typer.Exit(2) from None


def divergence_policy(on_divergence: DivergencePolicy | None, strict_divergence: bool) -> DivergencePolicy:
    """``--on-divergence``, with ``--strict-divergence`` as the alias of ``--on-divergence strict``.

    Raises:
        typer.BadParameter: both are given and disagree (exit 2).
    """
    if strict_divergence and on_divergence not in (None, "strict"):
        raise typer.BadParameter(
            f"--strict-divergence conflicts with --on-divergence {on_divergence}",
            param_hint="--on-divergence",
        )
    return "strict" if strict_divergence else on_divergence or "warn"


def environment_binding(manifest: str | None, state: str | None) -> dict[str, Any]:
    """``--environment-manifest`` / ``--state`` as the settings ``environment_manifest`` (a file)
    and ``environment_services`` (both keys, None where not bound: ``--state`` wins, as in
    BenchFlow; `reroll.tasks.manifest.resolve_manifest`, `parse_state`). A manifest that cannot be
    found is printed and exits with code 2."""
    bound: dict[str, Any] = {"environment_manifest": None, "environment_services": None}
    try:
        if state is not None:
            bound["environment_manifest"], bound["environment_services"] = parse_state(state)
        elif manifest is not None:
            bound["environment_manifest"] = resolve_manifest(manifest)
    except RerollError as exc:
        refuse(exc)
    return bound


def faults_from_flags(plan: Path | None, seed: int | None) -> FaultsUsed | None:
    """``--faults`` / ``--fault-seed``, checked: a bad plan is printed and exits with code 2."""
    if plan is None:
        if seed is not None:
            raise typer.BadParameter("--fault-seed needs --faults", param_hint="--fault-seed")
        return None
    from reroll.host.llm_proxy import faults_used  # the proxy's client (aiohttp): only with a plan

    try:
        return faults_used(plan, seed)
    except RerollError as exc:
        refuse(exc)


def sandbox_settings(config: str | None, image_map: list[str] | None) -> dict[str, Any] | None:
    """``--sandbox-config`` and ``--image-map`` as the JSON object of the sandbox backend's
    settings, which `RolloutSettings` parses by the backend's config model; None when neither is
    given. Bad input is printed and exits with code 2 (not a JSON object; an image map item that
    is not ``SRC=DST``)."""
    settings: dict[str, Any] = {}
    if config is not None:
        try:
            settings = orjson.loads(config)
        except orjson.JSONDecodeError as exc:
            refuse(ConfigError(f"--sandbox-config: not JSON: {exc}"))
        if not isinstance(settings, dict):
            refuse(ConfigError(f"--sandbox-config: expected a JSON object, got {config!r}"))
    if image_map:
        try:
            settings["image_map"] = parse_image_map(image_map)
        except RerollError as exc:
            refuse(exc)
    return settings if config is not None or image_map else None


def job_overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """The job-file fields (`reroll.jobs.jobfile.SETTINGS_KEYS`) that a command's settings flags
    give (``reroll job``'s, which override the file's), those not given left out: paths made
    absolute, a fault plan as its file and seed (read when the job starts), ``--image-map`` in
    ``sandbox_config``. Bad flags are printed and exit with code 2 (`sandbox_settings`)."""
    from reroll.jobs.jobfile import SETTINGS_KEYS

    given: dict[str, Any] = {
        SETTINGS_KEYS[FLAGS[name]]: value
        for name, value in flags.items()
        if name in FLAGS and FLAGS[name] in SETTINGS_KEYS
    }
    given["sandbox_config"] = sandbox_settings(flags.get("sandbox_config"), flags.get("image_map"))
    given["fault_seed"] = flags.get("fault_seed")
    bound = environment_binding(flags.get("environment_manifest"), flags.get("state"))
    manifest, services = bound["environment_manifest"], bound["environment_services"]
    given["environment_manifest"] = str(manifest) if manifest is not None else None
    given["environment_services"] = list(services) if services is not None else None
    for key in ("faults", "skills_dir"):
        given[key] = flags[key].resolve() if flags.get(key) is not None else None
    return {key: value for key, value in given.items() if value is not None}
