"""docs/continue.md's "What carries over" table names every setting with the carry it declares."""

from __future__ import annotations

import re
from pathlib import Path

from reroll.settings import RolloutSettings, carry_of

PAGE = Path(__file__).resolve().parents[2] / "docs" / "continue.md"


def test_the_carry_table_matches_the_settings() -> None:
    section = PAGE.read_text().split("## What carries over", 1)[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", section, re.MULTILINE))
    assert rows == {name: carry_of(name).value for name in RolloutSettings.model_fields}
