"""docs/architecture.md names every package: each import package of the five component folders
and every sub-package of ``reroll``, so a package added without a word in the map fails here.

A package counts as named when a code span of the page (between backticks) is its folder, its
import name, or (inside ``reroll``) its path below ``controller/reroll/``: ``reroll_contracts/wire/``,
``reroll.sandbox.local``, ``sandbox/local/``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
COMPONENTS = ("controller", "contracts", "sidecar", "proxy", "protos")
"""The top-level folders that hold import packages (pyproject.toml's ``packages.find``)."""


def packages() -> list[str]:
    """Dotted names of every import package (a folder with ``__init__.py``) of the components."""
    found = []
    for component in COMPONENTS:
        for init in sorted((ROOT / component).rglob("__init__.py")):
            found.append(".".join(init.parent.relative_to(ROOT / component).parts))
    return found


def named(text: str) -> set[str]:
    """The dotted forms of every code span of `text` that could name a package."""
    forms = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        path = span.strip().rstrip("/")
        first, _, rest = path.partition("/")
        if first in COMPONENTS and rest:
            path = rest
        dotted = path.replace("/", ".")
        forms |= {dotted, f"reroll.{dotted}"}
    return forms


def test_the_page_names_every_package() -> None:
    missing = sorted(set(packages()) - named(ARCHITECTURE.read_text()))
    assert not missing, (
        f"{ARCHITECTURE}: no paragraph or table row names the packages {missing}; name each in "
        "backticks (`sandbox/local/` below controller/reroll/, `reroll_contracts/wire/` elsewhere)"
    )


def test_the_packages_found_include_each_component_and_nested_ones() -> None:
    found = set(packages())
    assert {"reroll", "reroll_contracts", "reroll_sidecar", "reroll_proxy", "reroll_protos"} <= found
    assert {"reroll.sandbox.local", "reroll_contracts.wire"} <= found


def test_a_package_the_page_does_not_name_is_reported() -> None:
    assert "reroll.sandbox.local" in named("the backends: `sandbox/local/` and more")
    assert "reroll.sandbox.local" not in named("the backends: `local/` and more")
    assert "reroll_contracts.wire" in named("`contracts/reroll_contracts/wire/`")
