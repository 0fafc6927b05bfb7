"""``reroll job``: every task x agent x model x repeat of a job file or the flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import (
    ExecutorOption,
    MaxRetriesOption,
    MaxStartingOption,
    RayAddressOption,
    console,
    err_console,
    job_guarded,
    refuse,
)
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
    job_overrides,
)

if TYPE_CHECKING:
    from reroll.jobs.jobfile import JobSpec


def job(
    job_file: Annotated[
        Path | None, typer.Argument(help="YAML job file (tasks, agents, models, repeats, ...).")
    ] = None,
    task: Annotated[list[Path] | None, typer.Option(help="Task folder (repeatable).")] = None,
    agent: Annotated[list[str] | None, typer.Option(help="Agent name (repeatable).")] = None,
    model: Annotated[list[str] | None, typer.Option(help="Model spec (repeatable).")] = None,
    repeats: Annotated[int | None, typer.Option(help="Rollouts per (task, agent, model).")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Rollouts at once [default: 4].")] = None,
    max_retries: MaxRetriesOption = None,
    timeout: TimeoutOption = None,
    max_steps: MaxStepsOption = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where job folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the job folder RESUME (its job.json); skips finished rollouts."),
    ] = None,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    network: NetworkOption = None,
    environment_manifest: EnvironmentManifestOption = None,
    state: StateOption = None,
    faults: FaultsOption = None,
    fault_seed: FaultSeedOption = None,
    executor: ExecutorOption = None,
    max_starting: MaxStartingOption = None,
    ray_address: RayAddressOption = None,
    image_map: ImageMapOption = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            help="parallel-independent (each rollout on its own) or sequential-shared (one after "
            "another over a versioned learner store in JOB/store: skills and memory) "
            "[default: parallel-independent]."
        ),
    ] = None,
    store: Annotated[
        Path | None,
        typer.Option(
            help="sequential-shared: a folder (skills/, memory/) whose files are the store's generation 0."
        ),
    ] = None,
    skills: SkillsOption = None,
    skills_dir: SkillsDirOption = None,
    judge_model: JudgeModelOption = None,
    user_model: UserModelOption = None,
    ask_user: AskUserOption = None,
    without_mcp: WithoutMcpOption = None,
    checkpoint_every: CheckpointEveryOption = None,
    checkpoint_keep: CheckpointKeepOption = None,
    trial: Annotated[
        Path | None, typer.Option(help="Trial file (YAML) every rollout runs; see docs/trials.md.")
    ] = None,
) -> None:
    """Run a job: every task x agent x model x repeat, at bounded concurrency, then a summary.

    No --on-divergence: a job records, it replays nothing."""
    overrides = _overrides(locals())
    from reroll.jobs.runner import run_job

    if resume is not None and job_file is not None:
        err_console.print("[red]error:[/red] give a JOB_FILE or --resume JOB_DIR, not both")
        raise typer.Exit(2)
    try:
        spec = _job_spec(job_file, resume, overrides)
    except RerollError as exc:
        refuse(exc)
    job_guarded(run_job(spec, jobs_dir=resume.parent if resume is not None else jobs_dir, console=console))


JOB_FLAGS: dict[str, str] = {
    "task": "tasks",
    "agent": "agents",
    "model": "models",
    "repeats": "repeats",
    "concurrency": "concurrency",
    "max_retries": "max_retries",
    "job_name": "name",
    "executor": "executor",
    "max_starting": "max_starting",
    "ray_address": "ray_address",
    "schedule": "schedule",
    "store": "store",
    "trial": "trial",
}
"""Each flag of ``reroll job`` that is no rollout setting (a parameter name) → the job-file field
it sets; the settings' flags are `reroll.cli.flags.FLAGS`."""


def _overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """The job-file fields ``reroll job``'s parameters `flags` (``locals()``) give, which override
    the file's: the settings' (`job_overrides`) and the job's own (`JOB_FLAGS`), those not given
    left out, the store and trial paths made absolute. Bad settings flags are printed and exit
    with code 2."""
    given = {
        JOB_FLAGS[name]: value for name, value in flags.items() if name in JOB_FLAGS and value is not None
    }
    for key in ("store", "trial"):
        if key in given:
            given[key] = given[key].resolve()
    return job_overrides(flags) | given


def _job_spec(job_file: Path | None, resume: Path | None, overrides: dict[str, Any]) -> JobSpec:
    """The job to run: the job folder `resume`'s (its job.json), else `job_file`'s, else the flags'
    alone, with `overrides` (the flags) applied.

    Raises:
        JobError: the file or job.json is missing or invalid, or the job is (the message names it).
    """
    from reroll.jobs.jobfile import job_spec, load_job_file, load_saved_spec, with_overrides

    if resume is not None:
        saved = load_saved_spec(resume).model_dump(mode="json")
        return job_spec(
            {**with_overrides(saved, overrides), "name": resume.name}, f"{resume}/job.json", resume
        )
    if job_file is not None:
        return load_job_file(job_file, overrides)
    return job_spec(overrides, "the command line")
