"""README.md stays a newcomer's page: short, and every link in it leads to a file of the repository
(it is not part of the site, so `make docs --strict` does not check it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 200
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(text: str, folder: Path) -> list[str]:
    """The relative link targets of Markdown `text` that are no file of the repository below
    `folder`'s checkout (an anchor after ``#`` is not checked; absolute URLs are left alone)."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (folder / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    return broken


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"{README}: {lines} lines; move detail to a page under docs/"


def test_every_link_of_the_readme_leads_into_the_repository() -> None:
    assert broken_links(README.read_text(), ROOT) == []


def test_a_link_outside_the_repository_or_to_nothing_is_reported() -> None:
    text = "[design](../shared/DESIGN.md) [gone](docs/gone.md) [ok](docs/index.md#the-pages) [web](https://x.org)"
    assert broken_links(text, ROOT) == ["../shared/DESIGN.md", "docs/gone.md"]
