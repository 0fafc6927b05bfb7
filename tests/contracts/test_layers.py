"""The import graph points down only: the layers of docs/architecture.md ("The packages, top to bottom").

Read from the sources (no import): every ``from reroll… import`` of a module names the package it
comes from, and that package must sit below the importing one (or be the same).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = ROOT / "controller" / "reroll"
LAYERS: dict[str, int] = {
    "cli": 8,
    "conformance": 7,
    "jobs": 7,
    "rollout": 6,
    "environment": 5,
    "installs": 5,
    "settings": 5,
    "sandbox": 5,
    "host": 5,
    "models": 5,
    "view": 3,
    "export": 3,
    "agents": 2,
    "runfolder": 2,
    "tasks": 2,
    "trials": 1,
    "cache": 0,
    "yamlfiles": 0,
}
"""Controller packages and top-level modules → layer; a module may import its own layer's
packages only where noted in `SAME_LAYER`, lower layers always. view and export read run
folders: they sit just above runfolder, neither importing the other nor the rollout stack."""
SAME_LAYER = {
    ("models", "host"),
    ("sandbox", "host"),
    ("settings", "models"),
    ("settings", "sandbox"),
    ("environment", "sandbox"),
    ("installs", "sandbox"),
    ("installs", "host"),
}
PROXY_LAUNCHERS = {"host/llm_proxy.py", "host/intercept.py", "models/spec.py", "cli/model.py"}
"""The controller modules that start the LLM proxy's process (``python -m reroll_proxy``, the
mitmproxy addon file of its package) or the scripted model server's (``python -m
reroll_proxy.scripted``): the only ones that may name `reroll_proxy`. Every other
module reads what the proxy writes through the contracts (`reroll_contracts.wire`, the run
folder's models): readers sit below writers."""


def _imports(file: Path) -> set[str]:
    """Top-level names of the ``reroll…`` modules `file` imports (``reroll.x.y`` → ``reroll.x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module if node.module != "reroll" else f"reroll.{node.names[0].name}")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _proxy_references(file: Path) -> set[str]:
    """Where `file` reaches into the proxy's package: imports of ``reroll_proxy…`` (top-level or
    lazy) and calls naming it by a string (``import_module``, ``resources.files``, ``python -m``)."""
    named = {name for name in _imports(file) if name.split(".")[0] == "reroll_proxy"}
    found = {f"imports {name}" for name in named}
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Call):
            found.update(
                f"a call names {value.value!r}"
                for arg in node.args
                for value in ast.walk(arg)  # a bare string, or one in an argv list
                if isinstance(value, ast.Constant)
                and isinstance(value.value, str)
                and value.value.split(".")[0] == "reroll_proxy"
            )
    return found


def test_only_the_proxy_launchers_of_the_controller_name_the_proxy_package() -> None:
    offenders = [
        f"{file.relative_to(ROOT)}: {reference}"
        for file in sorted(CONTROLLER.rglob("*.py"))
        if file.relative_to(CONTROLLER).as_posix() not in PROXY_LAUNCHERS
        for reference in sorted(_proxy_references(file))
    ]
    assert offenders == []


@pytest.mark.parametrize("launcher", sorted(PROXY_LAUNCHERS))
def test_every_proxy_launcher_still_starts_the_proxy(launcher: str) -> None:
    assert _proxy_references(CONTROLLER / launcher), f"{launcher}: no longer names reroll_proxy"


@pytest.mark.parametrize("component", ["proxy", "sidecar", "contracts"])
def test_no_module_of_the_proxy_the_sidecar_or_the_contracts_imports_the_controller(component: str) -> None:
    offenders = [
        f"{file.relative_to(ROOT)}: {name}"
        for file in sorted((ROOT / component).rglob("*.py"))
        for name in _imports(file)
        if name == "reroll" or name.startswith("reroll.")
    ]
    assert offenders == []


def test_the_contracts_import_nothing_of_reroll_but_themselves() -> None:
    offenders = [
        f"{file.relative_to(ROOT)}: {name}"
        for file in sorted((ROOT / "contracts").rglob("*.py"))
        for name in _imports(file)
        if name.startswith("reroll") and not name.startswith("reroll_contracts")
    ]
    assert offenders == []


def test_every_controller_package_imports_only_downwards() -> None:
    offenders = []
    for file in sorted(CONTROLLER.rglob("*.py")):
        parts = file.relative_to(CONTROLLER).with_suffix("").parts
        if parts[0] == "__init__":
            continue  # the public API re-exports from every layer
        own = parts[0]
        assert own in LAYERS, f"{own}: a controller package without a layer in LAYERS"
        for name in _imports(file):
            if not name.startswith("reroll."):
                continue
            target = name.split(".")[1]
            if target in (own, "__init__") or target not in LAYERS:
                continue
            if LAYERS[target] > LAYERS[own] or (
                LAYERS[target] == LAYERS[own] and (own, target) not in SAME_LAYER
            ):
                offenders.append(f"{file.relative_to(ROOT)} ({own}) imports {name} ({target})")
    assert offenders == []


@pytest.mark.parametrize("reader", ["view", "export"])
def test_view_and_export_read_run_folders_through_the_runfolder_package_only(reader: str) -> None:
    allowed = {reader, "runfolder"}
    offenders = [
        f"{file.relative_to(ROOT)}: {name}"
        for file in sorted((CONTROLLER / reader).rglob("*.py"))
        for name in _imports(file)
        if name.startswith("reroll.") and name.split(".")[1] not in allowed
    ]
    assert offenders == []
