"""The bundled task `hello-file` (the images the docker contract also runs on, without Python
and busybox-only, are `tests.conftest.variant_images`)."""

from __future__ import annotations

import pytest
from reroll.tasks.task import Task, load_task

from tests.conftest import EXAMPLES


@pytest.fixture
def task() -> Task:
    return load_task(EXAMPLES / "hello-file")
