"""Fixtures shared by the job tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.conftest import spawning


@pytest.fixture(scope="session")
@spawning
def ray_instance() -> Iterator[None]:
    """A local Ray instance (2 logical CPUs: the largest concurrency of these tests) kept for the
    session of this pytest process; nothing when ray is not installed.

    A job on the ray executor joins an instance already running (`reroll.jobs.ray_executor.
    RayExecutor` starts one only when none is, and shuts down only the one it started), so the
    tests that run jobs on Ray in process share one start (20 to 30 s each on a loaded 2-core
    machine) instead of paying it per job. Its workers were started before any test's environment
    changes, so what a job needs on a worker must travel with it, as on a remote node. The
    executor's own start and shutdown of a local instance are exercised by ``reroll job
    --executor ray`` in a subprocess (test_ray_executor.py's lost-worker test).
    """
    if importlib.util.find_spec("ray") is None:
        yield
        return
    import ray

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        yield
    finally:
        ray.shutdown()
