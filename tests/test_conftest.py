"""The suite's own scheduling (`tests.conftest.slowest_first`): the slowest modules start first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from tests.conftest import ROOT, SLOWEST_MODULES, slowest_first

TESTS = ROOT / "tests"


@dataclass
class Collected:
    """What `slowest_first` reads of a collected test: its module's path (and a name to tell
    the tests of a module apart)."""

    path: Path
    name: str


def test_every_slowest_module_exists() -> None:
    assert [name for name in SLOWEST_MODULES if not (TESTS / name).is_file()] == []


def test_the_slowest_modules_come_first_and_each_module_keeps_its_order() -> None:
    def item(module: str, name: str) -> Collected:
        return Collected(TESTS / module, name)

    items = [
        item("agents/test_codex.py", "a"),
        item("jobs/test_ray_cluster.py", "b"),
        item("jobs/test_ray_cluster.py", "a"),
        item("agents/test_openhands.py", "z"),
        item("agents/test_openhands.py", "y"),
        item("test_cache.py", "c"),
        Collected(ROOT / "elsewhere" / "test_x.py", "x"),
    ]
    slowest_first(cast(list[Any], items), TESTS)
    assert [(item.path.name, item.name) for item in items] == [
        ("test_openhands.py", "z"),
        ("test_openhands.py", "y"),
        ("test_ray_cluster.py", "b"),
        ("test_ray_cluster.py", "a"),
        ("test_codex.py", "a"),
        ("test_cache.py", "c"),
        ("test_x.py", "x"),
    ]


def test_make_test_keeps_the_collection_order() -> None:
    """xdist reorders modules by their number of tests unless told not to."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ")[1].split("\n\n")[0]
    assert "--dist loadfile --no-loadscope-reorder" in recipe
