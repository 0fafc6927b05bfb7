"""Every file, folder and module the documentation names exists: a module moved or renamed
without its page fails here, naming the page and the line.

Read are the code spans (between backticks) of README.md and docs/*.md that name something of
this repository: a path from the top (``controller/reroll/cli/app.py``, ``tests/e2e/``), a path
inside an import package (``reroll/installs/store.py``, ``reroll_contracts/wire/``) or a dotted
module name (``reroll.rollout.start``, ``reroll.RolloutSettings``: the last part may be a name the
module defines). Paths relative to a task (``tests/test.sh``) and image names
(``reroll/base:bookworm``) are not of the repository and are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = (
    "controller",
    "contracts",
    "sidecar",
    "proxy",
    "protos",
    "scripts",
    "examples",
    "images",
    "tools",
    "docs",
)
PACKAGES = {
    "reroll": ROOT / "controller" / "reroll",
    "reroll_contracts": ROOT / "contracts" / "reroll_contracts",
    "reroll_sidecar": ROOT / "sidecar" / "reroll_sidecar",
    "reroll_proxy": ROOT / "proxy" / "reroll_proxy",
    "reroll_protos": ROOT / "protos" / "reroll_protos",
}
LABELS = {"reroll.owner"}
"""Docker labels written like module names (the others carry ``=value``)."""
DOTTED = re.compile(r"^(reroll(?:_contracts|_sidecar|_proxy|_protos)?)((?:\.[A-Za-z_]\w*)+)$")


def _module_file(folder: Path) -> Path | None:
    """The source of the module `folder` names (``x.py`` or ``x/__init__.py``), if any."""
    for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(source: str, name: str) -> bool:
    """Whether a module's `source` defines or imports `name` (or lists it in a lazy-import table)."""
    word = re.escape(name)
    patterns = (
        rf"^\s*(async def|def|class) {word}\b",  # a function or class
        rf"^\s*{word}\s*[:=]",  # a constant, or a field
        rf"[\"']{word}[\"']",  # a lazy-import table's key (`reroll.RolloutSettings`)
        rf"^\s*(from|import) .*\b{word}\b",  # a name imported into the module
    )
    return any(re.search(pattern, source, re.MULTILINE) for pattern in patterns)


def _dotted_exists(package: str, parts: list[str]) -> bool:
    """Whether ``package.parts…`` is a module, or a name a module among its prefixes defines."""
    for count in range(len(parts), -1, -1):
        module = _module_file(PACKAGES[package].joinpath(*parts[:count]))
        if module is not None:
            if count == len(parts):
                return True
            return _defines(module.read_text(), parts[count])
    return False


def _repository_path(text: str) -> Path | None:
    """The file or folder of the repository that the path `text` names, or None when it names
    nothing of ours (a task's own ``tests/test.sh``, a run folder's ``trajectory/``)."""
    first, _, rest = text.rstrip("/").partition("/")
    if not first or not rest:  # an absolute path is the sandbox's or the host's
        return None
    if first in TOP_FOLDERS:
        return ROOT / text
    if first == "tests":  # tests/<folder of ours>/…; a task's own tests/test.sh is not ours
        return ROOT / text if (ROOT / "tests" / rest.split("/")[0]).is_dir() else None
    if first in PACKAGES:
        if text.endswith((".py", "/")) or (PACKAGES[first] / rest.split("/")[0]).exists():
            return PACKAGES[first] / rest
        return None
    # docs/architecture.md: paths below controller/reroll/; a folder path whose next folder is not
    # the package's is a task's (`environment/workspace/`, beside `reroll.environment`)
    package = PACKAGES["reroll"] / first
    if (package / "__init__.py").is_file() and (
        text.endswith(".py") or (text.endswith("/") and (package / rest.split("/")[0]).exists())
    ):
        return PACKAGES["reroll"] / text
    return None


def missing(span: str) -> bool:
    """Whether the code span `span` names a path or module of the repository that does not exist
    (False for spans that name nothing of it). ``path.py:name`` also needs `name` in the file."""
    text = span.strip().rstrip(",")
    path, colon, name = text.partition(":")
    if colon and path.endswith(".py") and re.fullmatch(r"[A-Za-z_]\w*", name):
        file = _repository_path(path)
        return file is not None and not (file.is_file() and _defines(file.read_text(), name))
    if any(mark in text for mark in (" ", ":", "*", "<", "$", "~", "{", "|")):
        return False
    if dotted := DOTTED.match(text):
        if text in LABELS or text.endswith((".py", ".json", ".yaml", ".md", ".toml", ".txt")):
            return False
        return not _dotted_exists(dotted[1], dotted[2][1:].split("."))
    file = _repository_path(text)
    return file is not None and not file.exists()


def test_every_path_and_module_the_pages_name_exists() -> None:
    stale = [
        f"{page.relative_to(ROOT)}:{number}: `{span}`"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for span in re.findall(r"`([^`]+)`", line)
        if missing(span)
    ]
    assert not stale, "the documentation names what does not exist (moved? renamed?):\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("span", "is_missing"),
    [
        ("controller/reroll/cli/app.py", False),
        ("controller/reroll/cli/gone.py", True),
        ("reroll/installs/store.py", False),
        ("reroll/tasks.py", True),
        ("reroll_contracts/wire/", False),
        ("reroll_proxy/formats/", True),
        ("reroll.rollout.start", False),
        ("reroll.rollout.start.start_rollout", False),
        ("reroll.RolloutSettings", False),
        ("reroll.rollout.started", True),
        ("tests/e2e/test_main_job.py", False),
        ("tests/e2e/test_gone.py", True),
        ("tests/test.sh", False),
        ("reroll/base:bookworm", False),
        ("reroll/base", False),
        ("--sandbox local", False),
        ("reroll.owner", False),
        ("rollout/start.py:start_rollout", False),
        ("rollout/start.py:begin_rollout", True),
        ("rollout/started.py", True),
        ("sandbox/local/", False),
        ("sandbox/gone/plain.py", True),
        ("environment/workspace/", False),  # a task's folder, not below reroll.environment
        ("trajectory/llm_trajectory.jsonl", False),
        ("/etc/reroll/skills/", False),
        ("reroll_proxy.exchange", True),
        ("reroll_contracts.trajectory.Exchange", False),
    ],
)
def test_what_counts_as_missing(span: str, is_missing: bool) -> None:
    assert missing(span) is is_missing
