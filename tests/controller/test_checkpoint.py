"""Resolving ``--at`` to a cut index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.checkpoint import At, resolve_cut
from reroll.errors import RunFolderError
from reroll.resume import continuation_plan, open_checkpoint
from reroll.tasks import load_task
from rich.console import Console

from tests.controller.test_runfolder import exchange_line, make_run_folder

RUN = Path("/runs/r1")


@pytest.mark.parametrize(
    ("at", "expected"),
    [(None, 5), (0, 0), (5, 5), ("3", 3), (" 2 ", 2), (0.5, 2), ("0.5", 2), (0.0, 0), ("1.0", 5), (0.99, 4)],
)
def test_steps_and_fractions(at: At | None, expected: int) -> None:
    assert resolve_cut(at, 5, RUN) == expected


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (6, "--at 6 is out of range: the run has 5 recorded exchanges, so a step must be within 0..5"),
        (-1, "--at -1 is out of range"),
        ("7", "--at 7 is out of range"),
        (1.5, "--at 1.5: a fraction must be within 0.0..1.0"),
        ("-0.1", "a fraction must be within 0.0..1.0"),
        ("nan", "expected a step index (0..5) or a fraction"),
        ("half", "--at 'half': expected a step index (0..5) or a fraction"),
        (True, "expected a step index or a fraction"),
    ],
)
def test_bad_checkpoints_name_the_run_and_the_range(at: At, message: str) -> None:
    with pytest.raises(RunFolderError, match=r"^/runs/r1: ") as caught:
        resolve_cut(at, 5, RUN)
    assert message in str(caught.value)


def test_an_empty_recording_only_has_step_zero() -> None:
    assert resolve_cut(0.5, 0, RUN) == 0
    with pytest.raises(RunFolderError, match=r"within 0\.\.0"):
        resolve_cut(1, 0, RUN)


def test_a_continuation_keeps_the_runs_network_override(tmp_path: Path, examples: Path) -> None:
    """config.json's ``network`` (``reroll run --network``) outlives the task's own policy."""
    task = examples / "hello-file"
    assert load_task(task).spec.environment.network == "full"
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps(config | {"task_path": str(task), "agent": "oracle", "network": "none"})
    )
    checkpoint = open_checkpoint(folder, tasks_dir=None, at=None, console=Console(quiet=True))
    plan = continuation_plan(
        checkpoint,
        run_dir=tmp_path / "new",
        live_model=None,
        timeout_seconds=None,
        sandbox=None,
        divergence_policy="warn",
        provenance={},
    )
    assert plan.task.spec.environment.network == "none" and plan.config.network == "none"
