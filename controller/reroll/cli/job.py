"""``reroll job``: every task x agent x model x repeat of a job file or the flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import (
    ExecutorOption,
    FaultSeedOption,
    FaultsOption,
    ImageMapOption,
    JudgeModelOption,
    MaxRetriesOption,
    MaxStartingOption,
    NetworkOption,
    RayAddressOption,
    SandboxConfigOption,
    SandboxOption,
    SkillsDirOption,
    SkillsOption,
    console,
    err_console,
    job_guarded,
    refuse,
    sandbox_settings,
)


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
    timeout: Annotated[
        float | None, typer.Option(help="Agent budget in seconds [default: the task's].")
    ] = None,
    jobs_dir: Annotated[Path, typer.Option(help="Where job folders go.")] = Path("jobs"),
    job_name: Annotated[str | None, typer.Option(help="Job folder name [default: the start time].")] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Resume the job folder RESUME (its job.json); skips finished rollouts."),
    ] = None,
    sandbox: SandboxOption = None,
    sandbox_config: SandboxConfigOption = None,
    network: NetworkOption = None,
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
    ask_user: Annotated[
        bool | None,
        typer.Option(
            "--ask-user",
            help="Offer every agent an ask_user tool over MCP (as reroll run --ask-user; the job "
            "file's ask_user); a job's rollouts have no User, so the agent is told nobody answered.",
        ),
    ] = None,
) -> None:
    """Run a job: every task x agent x model x repeat, at bounded concurrency, then a summary.

    No --on-divergence: a job records, it replays nothing."""
    from reroll.jobs.jobfile import job_spec, load_job_file, load_saved_spec, with_overrides
    from reroll.jobs.runner import run_job

    flags = {
        "sandbox_config": sandbox_settings(sandbox_config, image_map),
        "tasks": task,
        "agents": agent,
        "models": model,
        "repeats": repeats,
        "concurrency": concurrency,
        "max_retries": max_retries,
        "timeout_seconds": timeout,
        "name": job_name,
        "sandbox": sandbox,
        "network": network,
        "faults": faults.resolve() if faults is not None else None,
        "fault_seed": fault_seed,
        "executor": executor,
        "max_starting": max_starting,
        "ray_address": ray_address,
        "schedule": schedule,
        "store": store.resolve() if store is not None else None,
        "skills": skills,
        "skills_dir": skills_dir.resolve() if skills_dir is not None else None,
        "judge_model": judge_model,
        "ask_user": ask_user,
    }
    overrides = {key: value for key, value in flags.items() if value is not None}
    if resume is not None and job_file is not None:
        err_console.print("[red]error:[/red] give a JOB_FILE or --resume JOB_DIR, not both")
        raise typer.Exit(2)
    try:
        if resume is not None:
            saved = load_saved_spec(resume).model_dump(mode="json")
            spec = job_spec(
                {**with_overrides(saved, overrides), "name": resume.name}, f"{resume}/job.json", resume
            )
            jobs_dir = resume.parent
        elif job_file is not None:
            spec = load_job_file(job_file, overrides)
        else:
            spec = job_spec(overrides, "the command line")
    except RerollError as exc:
        refuse(exc)
    job_guarded(run_job(spec, jobs_dir=jobs_dir, console=console))
