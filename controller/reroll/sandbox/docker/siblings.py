"""A task's image services as sibling containers of the rollout's (`reroll.environment.services`):
started on the rollout's network under their names, with the task's limits (`run_sibling`), and
watched and stopped through `SiblingContainer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from reroll_contracts.errors import SandboxError, TaskEnvironmentError

from reroll.host.owner import owner_label
from reroll.sandbox.docker.engine import OWNER_LABEL, ROLE_LABEL, RUN_ID_LABEL
from reroll.sandbox.docker.images import MANAGED_LABEL
from reroll.sandbox.spec import ResourceLimits, SiblingService


def run_sibling(
    engine: docker.DockerClient,
    network: Network,
    run_id: str,
    limits: ResourceLimits,
    spec: SiblingService,
    image: str | None,
    env: dict[str, str],
) -> Container:
    """Start the container of service `spec` (`reroll.sandbox.docker.backend.DockerSandbox.start_sibling`).

    Args:
        engine: the Docker engine.
        network: the rollout's network; the container joins it under the alias ``spec.name``.
        run_id: the rollout's id (its label and part of the name).
        limits: the sandbox's limits: its cpus, memory and pids apply to the container.
        spec: the service.
        image: the image built for it, else None (then ``spec.image``, pulled when not local).
        env: its environment variables.

    Raises:
        TaskEnvironmentError: no image, or it is missing and cannot be pulled (the task's fault).
        SandboxError: the engine failed to start the container (infrastructure, retried).
    """
    image = image or spec.image
    if image is None:
        raise TaskEnvironmentError(
            f"service {spec.name}: its image was not built (the sandbox did not start?)"
        )
    try:
        try:
            engine.images.get(image)
        except docker.errors.ImageNotFound:
            engine.images.pull(image)
    except docker.errors.APIError as exc:
        raise TaskEnvironmentError(f"service {spec.name}: image {image} is not available: {exc}") from exc
    command = {"entrypoint": ["sh", "-c"], "command": [spec.command]} if spec.command else {}
    try:
        container = engine.containers.run(
            image,
            **command,
            detach=True,
            init=True,
            name=f"reroll-{run_id}-service-{spec.name}-{secrets.token_hex(3)}",
            hostname=spec.name,
            labels={
                MANAGED_LABEL: "1",
                RUN_ID_LABEL: run_id,
                OWNER_LABEL: owner_label(),
                ROLE_LABEL: "service",
            },
            environment=env,
            working_dir=spec.workdir,
            network=network.name,
            networking_config={network.name: engine.api.create_endpoint_config(aliases=[spec.name])},
            nano_cpus=int(limits.cpus * 1e9),
            mem_limit=f"{limits.memory_mb}m",
            memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.pids_max,
        )
    except docker.errors.APIError as exc:
        raise SandboxError(f"service {spec.name}: cannot start a container of {image}: {exc}") from exc
    return container


class SiblingContainer:
    """A service's sibling container (`DockerSandbox.start_sibling`), as a
    `reroll.sandbox.seam.ServiceProcess`."""

    def __init__(self, container: Container) -> None:
        self.container = container

    async def exit_code(self) -> int | None:
        """Its exit code once it stopped, None while it runs."""
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(self.container.reload)
        state = self.container.attrs.get("State") or {}
        return None if state.get("Running", True) else int(state.get("ExitCode", -1))

    async def run_command(self, command: str, timeout_seconds: float) -> tuple[bool, str]:
        """Run `command` with ``sh -c`` in the container as root (compose's healthcheck)."""
        run = asyncio.to_thread(self.container.exec_run, ["sh", "-c", command], user="0")
        try:
            code, output = await asyncio.wait_for(run, timeout_seconds)
        except TimeoutError:
            return False, f"`{command}` did not finish within {timeout_seconds:g} s"
        except docker.errors.APIError as exc:
            return False, f"`{command}` could not run: {exc}"
        return code == 0, output.decode(errors="replace").strip()[-500:]

    async def output(self) -> bytes:
        """Its container's log (stdout and stderr)."""
        try:
            return bytes(await asyncio.to_thread(self.container.logs))
        except docker.errors.APIError:
            return b""

    async def stop(self) -> None:
        """Remove the container."""
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(self.container.remove, force=True, v=True)
