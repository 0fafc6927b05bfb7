"""``reroll task check``: load task folders and show what reroll makes of each.

For every task under the paths given (a task folder, or a folder searched recursively for
task.md / task.toml, not below a task folder), `check` loads it as a rollout does (the loader the
caller gives: the CLI's is `reroll.rollout.start.load_runnable_task`, which also builds the
verifier) and `render` prints its resolved configuration — the conventions
(working folder, the agent's user, where the verifier and the solution go), environment,
resources, network policy, time limits — then the foreign fields mapped onto reroll's and the
fields it ignores, each with the reason; the environment plane (services with their probes,
readiness, task selection, state, MCP servers); a task that does not load is shown with the cause.
A task that loads but would not run here as its harness runs it gets warnings, not a bare "ok"
(what the caller adds: the CLI adds bases with no stand-in and tasks that need their
image where the default ``local`` sandbox cannot build it).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from reroll_contracts.childenv import SECRET_NAME
from reroll_contracts.errors import TaskError
from reroll_contracts.network import PhaseNetworks
from reroll_contracts.sandbox_paths import DEFAULT_WORKDIR
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from reroll.tasks.environment import McpServerSpec, ServiceSpec, SetupCommand, start_order
from reroll.tasks.manifest import PERSISTENT_NOTE
from reroll.tasks.rubric import task_policy
from reroll.tasks.skills import bundled_skills_dir, load_skills
from reroll.tasks.spec import EnvironmentSection
from reroll.tasks.task import Task

TASK_FILES = ("task.md", "task.toml")


@dataclass(frozen=True)
class CheckedTask:
    """One task folder and what loading it gave: the task, or the reason it does not load, and
    what would keep it from running here as its harness runs it."""

    path: Path
    task: Task | None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


def find_task_dirs(path: Path) -> list[Path]:
    """`path` when it is a task folder, else every task folder below it (sorted; symlinked folders
    not followed, nothing searched below a task folder)."""
    if any((path / name).is_file() for name in TASK_FILES):
        return [path]
    found: list[Path] = []
    for root, dirs, files in os.walk(path):
        if any(name in files for name in TASK_FILES):
            found.append(Path(root))
            dirs.clear()
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def check(
    paths: list[Path], load: Callable[[Path], Task], advise: Callable[[Task], list[str]] | None = None
) -> list[CheckedTask]:
    """Load every task under `paths` (see `find_task_dirs`) with `load` (the CLI's:
    `reroll.rollout.start.load_runnable_task`, what a run loads a task with, so the two agree);
    a path that is no folder, or holds no task, is a failure. Each task gets the warnings of
    `advise` (the CLI's: bases with no stand-in, a task the default ``local`` sandbox cannot run
    here, a judge model a run here would refuse)."""
    results: list[CheckedTask] = []
    for path in paths:
        found = find_task_dirs(path) if path.is_dir() else [path]
        if not found:
            results.append(CheckedTask(path, None, f"{path}: no task.md or task.toml in it or below it"))
        for folder in found:
            try:
                task = load(folder)
                warnings = advise(task) if advise else []
                results.append(CheckedTask(folder, task, warnings=warnings))
            except TaskError as exc:
                results.append(CheckedTask(folder, None, str(exc)))
    return results


def resolved(task: Task) -> list[tuple[str, str]]:
    """The settings a rollout of `task` uses, as ``(setting, value)`` rows."""
    spec, environment = task.spec, task.spec.environment
    image = environment.docker_image or "reroll's base image"
    if task.dockerfile is not None:
        image = "environment/Dockerfile"
        if environment.build is not None:
            image = f"{environment.build.dockerfile} in {_relative(task.build_context, task.path)}/"
    hardening = spec.verifier.hardening
    plugins = ", ".join(spec.verifier.pytest_plugins) or "none"
    return [
        (
            "layout",
            f"{task.layout} ({'task.md' if task.layout == 'native' else 'task.toml + instruction.md'})",
        ),
        ("image (docker)", image),
        ("workdir", task.workdir or f"the image's WORKDIR, else {DEFAULT_WORKDIR}"),
        ("agent user", task.agent_user or "the image's USER, else root"),
        ("verifier", _verifier(task)),
        (
            "solution",
            f"{task.solution_dir.relative_to(task.path)}/ → {task.solution_mount}"
            if task.solution_dir
            else "none",
        ),
        ("logs", f"{task.logs_mount} (reward: {task.logs_mount}/verifier/reward.txt or reward.json)"),
        ("aggregate", _aggregate(task)),
        ("env", _keys(environment.env)),
        ("verifier env", _keys(spec.verifier.env)),
        ("solution env", _keys(spec.solution.env)),
        (
            "cpus / memory / pids",
            f"{environment.cpus:g} / {environment.memory_mb} MiB / {environment.pids_max}",
        ),
        ("network", _network(spec.networks())),
        (
            "timeouts",
            f"agent {spec.agent.timeout_sec:g} s, verifier {spec.verifier.timeout_sec:g} s, "
            f"image build {environment.build_timeout_sec:g} s",
        ),
        ("pytest plugins", f"{plugins}; autoload {'on' if hardening.plugin_autoload else 'off'}"),
        ("skills", _skills(task)),
        *environment_rows(environment, task.path),
    ]


def _verifier(task: Task) -> str:
    """The verifier row: what runs, where from, as whom."""
    folder = task.verifier_dir.relative_to(task.path)
    command, kind, options = task.spec.verifier.command, task.spec.verifier.type, task.spec.verifier.options
    if kind == "reward-kit":
        runner = f"{options['root']}/{options.get('entrypoint', 'reward.py')}"
        return f"{folder}/ → {task.verifier_mount}; reward-kit runs `python {runner}` there, as root"
    if kind == "ors-episode":
        return (
            "ors-episode: the terminal reward of "
            + ", ".join(map(str, options["inputs"]))
            + " (runs nothing)"
        )
    if kind == "agent-judge":
        return _agent_judge(options)
    if kind != "test-script":
        return f"{kind} (no test.sh)"
    if command is None:
        return f"{folder}/test.sh → {task.verifier_mount}, run as root"
    return f"{folder}/ → {task.verifier_mount}; runs `{command}` there, as root"


def _agent_judge(options: dict[str, object]) -> str:
    """The verifier row of an agent-judge: which of its two forms runs, its role and inputs."""
    role = f"role {options['role']}" if options.get("role") else "no role"
    inputs = options.get("inputs")
    listed = ", ".join(map(str, inputs)) if isinstance(inputs, list) else ""
    if inputs and options.get("agent") is None:
        return f"agent-judge: one judge call over {listed}, {role} (no test.sh)"
    agent = options.get("agent") or "mini-swe-agent"
    told = f", told {listed}" if listed else ""
    return f"agent-judge: agent {agent} in a sandbox of its own, {role}{told} (no test.sh)"


def _network(networks: PhaseNetworks) -> str:
    """The network row: one policy, or each phase's where they differ; an allow-list as
    ``none + allowed: HOST, ...``, a deny list as ``full - denied: HOST, ...`` (its URL prefixes
    after ``URLs under``), every port of each, names resolved on the host when the phase starts
    (said once)."""

    def policy(phase: Literal["agent", "verifier"]) -> str:
        allowed = networks.allowed(phase)
        if phase == "agent" and (networks.agent_denied or networks.agent_blocked_urls):
            denied = [", ".join(networks.agent_denied) + " (and their subdomains)"] * bool(
                networks.agent_denied
            )
            if urls := networks.agent_blocked_urls:
                denied.append("URLs under " + ", ".join(urls) + " (HTTP(S) only, through an interceptor)")
            return "full - denied: " + "; ".join(denied)
        if allowed:
            return "none + allowed: " + ", ".join(allowed)
        return networks.agent if phase == "agent" else networks.verifier

    agent, verifier = policy("agent"), policy("verifier")
    shown = agent if agent == verifier else f"agent (and oracle) {agent}, verifier {verifier}"
    return shown + (" (every port; names resolved on the host)" if networks.filtered else "")


def _aggregate(task: Task) -> str:
    """The aggregate row: how a graded reward.json's items make one reward (verifier.md's
    ``outputs.aggregate_policy``, `reroll_contracts.graded`)."""
    policy = task_policy(task.spec.verifier.aggregate_policy)
    if policy is None:
        return "reward.json's own aggregate, else its reward key (no aggregate_policy declared)"
    parts = [policy.method or "reward.json's own method"]
    if policy.weights is not None:
        parts.append("weights " + ", ".join(f"{name} {weight:g}" for name, weight in policy.weights.items()))
    if policy.threshold is not None:
        parts.append(f"threshold {policy.threshold:g}")
    if policy.criteria is not None:
        parts.append("criteria " + ", ".join(policy.criteria))
    criteria = task.spec.verifier.type == "reward-kit" and task.spec.verifier.options.get("criteria")
    source = f"the reward-kit criteria {criteria}" if criteria else "verifier.md's aggregate_policy"
    return "; ".join(parts) + f" ({source})"


def environment_rows(environment: EnvironmentSection, task_dir: Path) -> list[tuple[str, str]]:
    """The environment plane of the task in `task_dir` as ``(setting, value)`` rows: one per
    service (in start order, with its probe; a built one's context seen from `task_dir`), the
    lifecycle, readiness, task selection, state, setup commands and MCP servers."""
    return [
        (name, escape(value)) for name, value in _plane_rows(environment, task_dir)
    ]  # they quote the task


def _plane_rows(environment: EnvironmentSection, task_dir: Path) -> list[tuple[str, str]]:
    rows = [
        (
            f"service {service.name}",
            f"{_runs(service, environment, task_dir)}; ready: {service.describe_probe()}",
        )
        for service in start_order(environment.services)
    ]
    if environment.owns_lifecycle:
        rows.append(("lifecycle", "the image's entrypoint starts its services; reroll gates on readiness"))
    readiness = environment.readiness
    probes = [*readiness.http, *(f"tcp {port}" for port in readiness.tcp)]
    if environment.healthcheck is not None:
        probes.append(environment.healthcheck.describe())
    if rows or probes:
        within = f"within {readiness.timeout_sec:g} s"
        rows.append(("readiness", f"{', '.join(probes) or 'the services'}; {within}"))
    rows += _lifetime_rows(environment)
    if (selection := environment.task_selection) is not None:
        how = f" {selection.key} (into the {selection.inject_into})" * (selection.mechanism == "env_var")
        rows.append(("task selection", f"{selection.mechanism}{how}"))
    if environment.forward_env.keys:
        keys = [
            f"{key} (never: named like a secret)" if SECRET_NAME.search(key) else key
            for key in environment.forward_env.keys
        ]
        rows.append(("forwarded env", ", ".join(keys)))
    if (state := environment.state) is not None:
        where = f" in service {state.service}" if state.service else ""
        what = ", ".join(state.paths) or "snapshot/restore commands"
        queried = "; query_command → the verifier's environment_state.txt" if state.query_command else ""
        rows.append(("state", f"{state.kind}: {what}{where}{queried}"))
    for index, setup in enumerate(environment.setup_commands):
        rows.append((f"setup {index + 1}", _setup(setup)))
    for server in environment.mcp_servers:
        target = server.url if server.transport != "stdio" else " ".join([server.command or "", *server.args])
        filters = _filters(server)
        rows.append(
            (f"mcp {server.name}", f"{server.transport} {target}{' (optional)' * server.optional}{filters}")
        )
    return rows


def _lifetime_rows(environment: EnvironmentSection) -> list[tuple[str, str]]:
    """The environment's endpoints (BenchFlow's ``ports`` with the services'), and its
    ``keep_alive`` and ``isolation`` when not the defaults, as rows."""
    rows = []
    if urls := environment.endpoints():
        rows.append(("endpoints", f"{', '.join(urls)} (from the sandbox; none published to the host)"))
    if not environment.keep_alive:
        rows.append(("keep_alive", "false: a service may exit once ready (recorded, not a crash)"))
    if environment.isolation == "persistent":
        rows.append(("isolation", f"persistent {PERSISTENT_NOTE}"))
    return rows


def _filters(server: McpServerSpec) -> str:
    """`server`'s tool filters for its row (``; tools a, b; tags +inbox -admin``); empty when none."""
    parts = []
    if server.tools is not None:
        parts.append(f"tools {', '.join(server.tools)}")
    tags = [f"+{tag}" for tag in server.include_tags or []] + [f"-{tag}" for tag in server.exclude_tags or []]
    if tags:
        parts.append(f"tags {' '.join(tags)}")
    return "".join(f"; {part}" for part in parts)


def _relative(path: Path, task_dir: Path) -> str:
    """`path` as seen from the task's folder (``../shared/environment``)."""
    return os.path.relpath(path, task_dir)


INTERPRETERS = frozenset({"python", "python3", "bash", "sh", "node", "ruby", "perl"})
"""Programs whose first argument is the service's own program (``python3 /app/service.py``)."""


def program_source(service: ServiceSpec, environment: EnvironmentSection, task_dir: Path) -> str:
    """Where the program of `service` (a command run inside the sandbox) comes from: the task's
    ``environment/workspace/`` (copied into the working folder), or, when the task folder does not
    hold it, only the sandbox's image (an entry point a manifest's base image installs, say
    BenchFlow's ``claw-gmail``: the task runs only where that image is the sandbox's)."""
    try:
        words = shlex.split(service.command or "")
    except ValueError:
        return "its program not parsed"
    if not words:
        return "no command"
    program = words[0]
    interpreted = Path(program).name in INTERPRETERS and len(words) > 1 and not words[1].startswith("-")
    if interpreted:
        program = words[1]
    seed = task_dir / "environment" / "workspace"
    workdir = PurePosixPath(environment.workdir or DEFAULT_WORKDIR)
    # An interpreter's script is a path from the service's folder (``python3 counter.py``); a bare
    # program name without one is looked up on PATH, so only the image can have it.
    path = PurePosixPath(service.workdir or workdir) / program if interpreted else PurePosixPath(program)
    inside = path.relative_to(workdir) if path.is_relative_to(workdir) else path
    if "/" in str(path) and not inside.is_absolute() and (seed / inside).exists():
        return f"{program} from the task's environment/workspace/{inside}"
    image = environment.docker_image or "the task's image"
    return f"{program} is not in the task folder: only the sandbox's image ({image}) has it"


def _setup(setup: SetupCommand) -> str:
    """A setup command as a phrase: its line, time limit, user, folder and host lock."""
    parts = [f"≤ {setup.timeout_sec:g} s"]
    parts += [f"as {setup.user}"] if setup.user is not None else []
    parts += [f"in {setup.cwd}"] if setup.cwd else []
    parts += [f"host lock {setup.host_lock}"] if setup.host_lock else []
    return f"{setup.command} ({', '.join(parts)}; before the agent)"


def _runs(service: ServiceSpec, environment: EnvironmentSection, task_dir: Path) -> str:
    if service.build is not None:
        command = f", command {service.command}" if service.command else ""
        where = f"{service.build.dockerfile} in {_relative(task_dir / service.build.context, task_dir)}/"
        return f"image built from {where} (a sibling container, docker only{command})"
    if service.image is not None:
        command = f", command {service.command}" if service.command else ""
        return f"image {service.image} (a sibling container, docker only{command})"
    port = f", port {service.port}" if service.port else ""
    source = program_source(service, environment, task_dir)
    if service.if_installed:
        source += "; started only where its program runs (--help), else skipped"
    return f"command {service.command} (inside the sandbox, as root{port}; {source})"


def _skills(task: Task) -> str:
    """The skills of the task's ``environment/skills`` (what ``--skills with-skill`` mounts), and
    the image's ``environment.skills_dir`` (Harbor's), which reroll does not mount (issue 29, 13)."""
    declared = task.spec.environment.skills_dir
    image = (
        f"; environment.skills_dir {declared}: not mounted (the image's own copy stays as built; "
        "reroll mounts environment/skills at each agent's native skill paths with --skills with-skill)"
        if declared
        else ""
    )
    folder = bundled_skills_dir(task.path)
    if not folder.is_dir():
        return "none" + image
    try:
        skills = load_skills(folder)
    except TaskError as exc:
        return f"[red]{exc}[/red]{image}"
    found = ", ".join(f"{skill.name} ({skill.description or 'no description'})" for skill in skills)
    return f"{folder.relative_to(task.path)}: {found}{image}"


def _keys(env: dict[str, str]) -> str:
    return ", ".join(sorted(env)) or "none"


def render(results: list[CheckedTask], console: Console) -> None:
    """Print a summary table of `results`, then each task's resolved configuration, mapped and
    ignored fields (or why it does not load)."""
    summary = Table(title="tasks", title_justify="left")
    for column in ("task", "layout", "status", "ignored"):
        summary.add_column(column)
    for result in results:
        task = result.task
        if task is None:
            summary.add_row(str(result.path), "-", "[red]does not load[/red]", "-")
        else:
            count = len(result.warnings)
            status = f"[yellow]{count} warning{'s' * (count > 1)}[/yellow]" if count else "[green]ok[/green]"
            summary.add_row(str(result.path), task.layout, status, str(len(task.ignored)))
    console.print(summary)
    for result in results:
        console.print()
        if result.task is None:
            console.print(
                f"[bold]{result.path}[/bold]: [red]does not load[/red]\n{escape(result.error or '')}"
            )
            continue
        task = result.task
        table = Table(title=f"{task.name}  ({task.path})", title_justify="left", show_header=False)
        table.add_column("setting", style="bold")
        table.add_column("value")
        for name, value in resolved(task):
            table.add_row(name, value)
        for note in task.mapped:
            table.add_row("mapped", escape(f"{note.field} → {note.note}"))
        for note in task.ignored:
            table.add_row("[yellow]ignored[/yellow]", escape(f"{note.field}: {note.note}"))
        for warning in result.warnings:
            table.add_row("[yellow]warning[/yellow]", escape(warning))
        console.print(table)
