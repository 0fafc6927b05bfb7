"""A loaded task as one run changes it: another network policy (`with_network`), another
environment manifest or a subset of its services (`with_environment`), limits lowered to the
host's (`capped_to_host`), its skills hidden (`with_skills_hidden`). Each returns a copy; the task
as loaded is never changed."""

from __future__ import annotations

from pathlib import Path

from reroll_contracts.errors import TaskError
from reroll_contracts.network import NetworkPolicy

from reroll.tasks.task import Task, load_task


def with_network(task: Task, policy: NetworkPolicy | None) -> Task:
    """`task` with the network policy of every phase replaced by `policy` (a run's override:
    ``environment.network`` set, ``agent.network`` and ``verifier.network`` cleared, and every
    ``allowed_hosts``, the ``blocked_hosts`` and ``blocked_urls``: ``none`` then reaches only the
    LLM proxy); None: `task`."""
    if policy is None:
        return task
    spec = task.spec
    cleared: dict[str, object] = {"network": None, "allowed_hosts": []}
    update = {
        "environment": spec.environment.model_copy(
            update={"network": policy, "allowed_hosts": [], "blocked_hosts": [], "blocked_urls": []}
        ),
        "agent": spec.agent.model_copy(update=cleared),
        "verifier": spec.verifier.model_copy(update=cleared),
    }
    return task.model_copy(update={"spec": spec.model_copy(update=update)})


def with_environment(task: Task, manifest: Path | None, services: tuple[str, ...] | None) -> Task:
    """`task` bound to a run's environment (BenchFlow's ``--environment-manifest`` / ``--state``):
    loaded again with `manifest` instead of its own (None: as it is), then with only `services`
    of its ``environment.services`` (None: all).

    Raises:
        TaskError: the task does not load with that manifest, or a service named is not declared
            (the declared ones listed).
    """
    if manifest is not None:
        task = load_task(task.path, manifest)
    if services is None:
        return task
    declared = [service.name for service in task.spec.environment.services]
    missing = [name for name in services if name not in declared]
    if missing:
        raise TaskError(
            f"--state tools {', '.join(missing)}: not services of the environment "
            f"(it declares: {', '.join(declared) or 'none'})"
        )
    kept = [  # what a kept service depends on among those left out: not waited for
        service.model_copy(update={"depends_on": [name for name in service.depends_on if name in services]})
        for service in task.spec.environment.services
        if service.name in services
    ]
    environment = task.spec.environment.model_copy(update={"services": kept})
    return task.model_copy(update={"spec": task.spec.model_copy(update={"environment": environment})})


def capped_to_host(task: Task, host_cpus: float, host_memory_mb: int) -> tuple[Task, list[str]]:
    """`task` with ``environment.cpus`` and ``memory_mb`` at most what the host has, and one note
    per limit lowered. Harbor's and BenchFlow's users run tasks asking for more (SkillsBench's
    ``cpus = 8``) on laptops; a container engine refuses more CPUs than it has (Docker's
    ``Range of CPUs is from 0.01 to N``).

    Args:
        task: the task as loaded.
        host_cpus: the CPUs this host offers (`reroll.cache.host_cpus`).
        host_memory_mb: its memory in MiB (`reroll.cache.host_memory_mb`).

    Returns:
        ``(task, notes)``: `task` itself and no notes when it fits.
    """
    environment = task.spec.environment
    update: dict[str, float | int] = {}
    notes = []
    if environment.cpus > host_cpus:
        update["cpus"] = host_cpus
        notes.append(
            f"task {task.name} asks for environment.cpus = {environment.cpus:g} but this host has "
            f"{host_cpus:g}: the sandbox runs with cpus = {host_cpus:g}"
        )
    if environment.memory_mb > host_memory_mb:
        update["memory_mb"] = host_memory_mb
        notes.append(
            f"task {task.name} asks for environment.memory_mb = {environment.memory_mb} but this host "
            f"has {host_memory_mb} MiB: the sandbox runs with memory_mb = {host_memory_mb}"
        )
    if not update:
        return task, []
    capped = environment.model_copy(update=update)
    return task.model_copy(update={"spec": task.spec.model_copy(update={"environment": capped})}), notes


def with_skills_hidden(task: Task, hidden: bool) -> Task:
    """`task` with `Task.skills_hidden` set to `hidden`."""
    return task if task.skills_hidden == hidden else task.model_copy(update={"skills_hidden": hidden})
