"""The bundled task `hello-file`, for the backend-specific sandbox tests."""

from __future__ import annotations

import pytest
from reroll.tasks import Task, load_task

from tests.conftest import EXAMPLES


@pytest.fixture
def task() -> Task:
    return load_task(EXAMPLES / "hello-file")
