"""scripts/conformance/run: several job folders read as one table (a re-run replaces a task's row)."""

from __future__ import annotations

import json
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "conformance"


@pytest.fixture(scope="module")
def run() -> ModuleType:
    loader = SourceFileLoader("conformance_run", str(SCRIPTS / "run"))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    sys.modules[spec.name] = module
    loader.exec_module(module)
    return module


def _rollout(job: Path, task: str, error: str, reward: float) -> None:
    folder = job / f"{task}__oracle__no-model__r1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"task_path": f"/corpus/{task}"}))
    result = {"status": "error" if error else "ok", "error": error, "rewards": {"reward": reward}}
    (folder / "result.json").write_text(json.dumps(result))


def test_a_later_job_replaces_a_tasks_row(run: ModuleType, tmp_path: Path) -> None:
    _rollout(tmp_path / "first", "a", "docker build failed: returned a non-zero code: 137", 0)
    _rollout(tmp_path / "first", "b", "", 1.0)
    _rollout(tmp_path / "rerun", "a", "", 1.0)
    rows = {row.task: row.verdict for row in run.latest_results([tmp_path / "first", tmp_path / "rerun"])}
    assert rows == {"a": "pass", "b": "pass"}
    page = run.markdown(
        run.latest_results([tmp_path / "first"]),
        commit="abc",
        sandbox="docker",
        command="c",
        about="**sample**",
    )
    assert "**sample**" in page and "oracle pass: 1 of 2 (offline-capable)" in page
