"""A loaded task as the sandbox backends see it: `sandbox_spec`, the one place a `Task` becomes a
`reroll.sandbox.spec.SandboxSpec`.

It sits above both (the rollout layer): the task loader knows nothing of sandboxes, and no backend
reads a task.
"""

from __future__ import annotations

from reroll.cache import build_timeout_multiplier
from reroll.sandbox.spec import ImageBuild, ResourceLimits, SandboxSpec, SiblingService
from reroll.tasks.environment import ServiceSpec
from reroll.tasks.task import SKILLS_FOLDER, Task


def sandbox_spec(task: Task) -> SandboxSpec:
    """What a backend needs of `task`: its limits (``environment``) and the agent phase's network
    policy and allow-list (the verify's are the verifier's to apply,
    `reroll.rollout.verify.script_verifier`; ``listed`` when a phase has one), working folder,
    logs and verifier mounts, agent user, workspace seed (``environment/workspace/``), image
    (its Dockerfile and context, with ``skills/`` hidden when `Task.skills_hidden`, else its
    ``docker_image``) and its services that run as sibling containers (those with an ``image`` or
    a ``build``). Its image build's time limit is the task's ``build_timeout_sec`` times this
    host's `reroll.cache.build_timeout_multiplier`.

    Raises:
        ConfigError: ``$REROLL_BUILD_TIMEOUT_MULTIPLIER`` is not a number greater than 0.
        TaskError: an allow-list on a phase under ``full`` (`reroll.tasks.spec.TaskSpec.networks`).
    """
    environment = task.spec.environment
    networks = task.spec.networks()
    dockerfile = task.dockerfile
    build = None
    if dockerfile is not None:
        hidden = frozenset({SKILLS_FOLDER}) if task.skills_hidden else frozenset()
        build = ImageBuild(context=task.build_context, dockerfile=dockerfile, hidden=hidden)
    return SandboxSpec(
        name=task.name,
        network=networks.agent,
        allowed=networks.agent_allowed if networks.agent == "none" else (),
        denied=networks.agent_denied if networks.agent == "none" else (),
        listed=networks.filtered,
        limits=ResourceLimits(
            cpus=environment.cpus,
            memory_mb=environment.memory_mb,
            pids_max=environment.pids_max,
            storage_mb=environment.storage_mb,
        ),
        workdir=task.workdir,
        logs_mount=task.logs_mount,
        verifier_mount=task.verifier_mount,
        agent_user=task.agent_user,
        workspace_seed=task.workspace_seed_dir,
        build=build,
        docker_image=environment.docker_image,
        build_timeout_seconds=environment.build_timeout_sec * build_timeout_multiplier(),
        siblings=tuple(_sibling(task, service) for service in environment.services if service.sibling),
    )


def _sibling(task: Task, service: ServiceSpec) -> SiblingService:
    """`service` (it has an ``image`` or a ``build``) as the docker backend runs it."""
    build = None
    if service.build is not None:
        context = task.service_context(service)
        build = ImageBuild(context=context, dockerfile=context / service.build.dockerfile)
    return SiblingService(
        name=service.name, image=service.image, build=build, command=service.command, workdir=service.workdir
    )
