"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "tasks"


@pytest.fixture
def examples() -> Path:
    """The bundled example tasks."""
    return EXAMPLES
