"""A started sandbox of each backend, from the bundled task `hello-file`, stopped after each test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from reroll.sandbox.base import Sandbox, create_sandbox
from reroll.tasks import Task, load_task

from tests.conftest import EXAMPLES

BACKENDS = [pytest.param("local"), pytest.param("docker", marks=pytest.mark.slow)]


@pytest.fixture
def task() -> Task:
    return load_task(EXAMPLES / "hello-file")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """A backend name; docker gets its images built once per session first."""
    if request.param == "docker":
        request.getfixturevalue("docker_images")
    return str(request.param)


@pytest.fixture
def run_id() -> str:
    return f"contract-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def sandbox(backend: str, task: Task, run_id: str) -> AsyncIterator[Sandbox]:
    """A started sandbox, stopped after the test."""
    created = create_sandbox(backend, task, run_id)
    await created.start()
    try:
        yield created
    finally:
        await created.stop()
