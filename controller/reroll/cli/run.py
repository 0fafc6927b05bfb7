"""``reroll run``: record one rollout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import console, finish, guarded, refuse
from reroll.cli.flags import (
    AskUserOption,
    CheckpointEveryOption,
    CheckpointKeepOption,
    EnvironmentManifestOption,
    FaultSeedOption,
    FaultsOption,
    ImageMapOption,
    JudgeModelOption,
    MaxStepsOption,
    NetworkOption,
    SandboxConfigOption,
    SandboxOption,
    SkillsDirOption,
    SkillsOption,
    StateOption,
    TimeoutOption,
    UserModelOption,
    WithoutMcpOption,
    rollout_settings,
)


def run(
    task: Annotated[
        Path | None,
        typer.Argument(
            help="Task folder (task.md, or task.toml + instruction.md) [default: the trial's task]."
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(help="Agent name; see `reroll agents` (with --trial: of the roles that name none)."),
    ] = None,
    trial: Annotated[
        Path | None,
        typer.Option(help="Trial file (YAML): scenes, roles, turns, User-driven rounds; see docs/trials.md."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Live model: scripted, scripted:PATH, scripted-anthropic[:PATH], scripted-responses[:PATH], "
            "scripted-chat[:PATH], openai/NAME, openai-responses/NAME, anthropic/NAME, gemini/NAME, "
            "PROVIDER/NAME (with PROVIDER_BASE_URL)"
        ),
    ] = None,
    timeout: TimeoutOption = None,
    max_steps: MaxStepsOption = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where run folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    network: NetworkOption = None,
    environment_manifest: EnvironmentManifestOption = None,
    state: StateOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    image_map: ImageMapOption = None,
    skills: SkillsOption = None,
    skills_dir: SkillsDirOption = None,
    judge_model: JudgeModelOption = None,
    user_model: UserModelOption = None,
    ask_user: AskUserOption = None,
    without_mcp: WithoutMcpOption = None,
    checkpoint_every: CheckpointEveryOption = None,
    checkpoint_keep: CheckpointKeepOption = None,
) -> None:
    """Record one rollout: run AGENT (or the trial's scenes) on TASK, record every LLM exchange, verify.

    No --on-divergence: a recording replays nothing, so nothing can diverge."""
    settings = rollout_settings(locals())
    from reroll.rollout.commands.record import run_task
    from reroll.trials.config import load_trial

    try:
        trial_config = load_trial(trial) if trial is not None else None
    except RerollError as exc:
        refuse(exc)
    recording = run_task(
        task,
        agent_name=agent,
        model=model,
        trial=trial_config,
        options=settings,
        jobs_dir=jobs_dir,
        job_name=job_name,
        console=console,
    )
    finish(guarded(recording))
