"""The ``ray`` executor: each attempt of a rollout is one Ray task (``reroll job --executor ray``).

Imported only when that executor is chosen (`reroll.jobs.executors.create_executor`); needs
``pip install 'reroll[ray]'``.

- Cluster: with no ``ray_address`` a local Ray instance is started for the job
  (``ray.init(address="local", num_cpus=concurrency)``: one logical CPU per rollout slot, since a
  rollout mostly waits on its agent) and shut down after it; with an address (``auto``,
  ``ray://host:10001``) the job joins that cluster and leaves it running. Every node needs reroll
  installed (same version) and the task folders and jobs dir at the same paths (a shared file
  system), since a task writes its run folder where the controller will read it.
- Each task asks for 1 CPU, so a node runs at most as many rollouts as it has CPUs; the
  controller keeps at most ``concurrency`` tasks in flight. ``max_starting`` is not applied:
  a Ray worker runs one rollout at a time, and the cluster's CPUs bound what starts at once.
- Retries: Ray's own retries are off (``max_retries=0``); a task Ray lost (its worker or node
  died) becomes an `InfrastructureError`, which the job's loop retries with backoff like any
  infrastructure failure, setting the partial run folder aside. An exception raised inside the
  task (bad input found late) is re-raised as it is, as with the asyncio executor.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

import ray
import ray.exceptions
from reroll_contracts.errors import InfrastructureError

from reroll.jobs.executors import Attempt
from reroll.jobs.jobfile import RunnerOptions
from reroll.rollout.start import RolloutOutcome


def _run_in_worker(attempt: Attempt) -> RolloutOutcome:
    """The Ray task's body: run the attempt in a fresh event loop of the worker process."""

    async def main() -> RolloutOutcome:
        return await attempt.run(start_gate=None)

    return asyncio.run(main())


class RayExecutor:
    """Runs attempts as Ray tasks; see the module docstring."""

    def __init__(self, options: RunnerOptions) -> None:
        self._options = options
        self._slots = asyncio.Semaphore(options.concurrency)
        self._started_ray = False
        self._remote: Any = None

    async def __aenter__(self) -> RayExecutor:
        """Start a local Ray instance (or join ``ray_address``).

        Raises:
            InfrastructureError: Ray could not start or the cluster could not be reached.
        """
        if not ray.is_initialized():
            address = self._options.ray_address
            local = address is None
            try:
                ray.init(
                    address="local" if local else address,
                    num_cpus=self._options.concurrency if local else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InfrastructureError(f"Ray: cannot start or join a cluster ({address}): {exc}") from exc
            self._started_ray = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_run_in_worker)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Shut the Ray instance down if this executor started it."""
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    async def run(self, attempt: Attempt) -> RolloutOutcome:
        """Run `attempt` as a Ray task once fewer than ``concurrency`` are in flight.

        Raises:
            InfrastructureError: Ray lost the task (worker or node died, task cancelled).
            Exception: whatever the attempt itself raised, unwrapped.
        """
        async with self._slots:
            ref = self._remote.remote(attempt)
            try:
                outcome: RolloutOutcome = await ref
            except asyncio.CancelledError:
                ray.cancel(ref, force=True)  # the worker dies; its rollout's children die with it
                raise
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, Exception):
                    raise exc.cause from None
                raise InfrastructureError(f"{attempt.run_dir.name}: Ray task failed: {exc}") from exc
            except ray.exceptions.RayError as exc:
                raise InfrastructureError(f"{attempt.run_dir.name}: Ray lost the task: {exc}") from exc
            return outcome
