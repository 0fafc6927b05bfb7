"""A checkpoint's layers are checked before a restore: a layer missing (a crash between layers), a
layer file that is not the one recorded, layers of different steps — each refused with
EnvironmentStateError naming the cause."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from reroll.agents import get_agent
from reroll.rollout.layers import (
    LayeredCheckpoint,
    LayerName,
    LayerRecord,
    load_checkpoint,
    restore_checkpoint,
)
from reroll.runfolder.paths import CHECKPOINT_FILE
from reroll.sandbox.layout import SandboxLayout
from reroll.tasks.task import load_task
from reroll_contracts.errors import EnvironmentStateError

from tests.conftest import EXAMPLES


def write_checkpoint(
    folder: Path, *, layers: int = 3, steps: tuple[int, ...] = (5, 5, 5)
) -> LayeredCheckpoint:
    """A checkpoint of step 5 expecting three layers, `layers` of them captured (at `steps`)."""
    folder.mkdir(parents=True, exist_ok=True)
    names: tuple[LayerName, ...] = ("environment", "sandbox", "session")
    records = []
    for name, step in list(zip(names, steps, strict=True))[:layers]:
        data = f"{name} bytes".encode()
        (folder / f"{name}.tar").write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        records.append(
            LayerRecord(
                name=name, file=f"{name}.tar", step=step, sha256=sha, size_bytes=len(data), digest="d"
            )
        )
    checkpoint = LayeredCheckpoint(
        step=5, task="t", agent="a", expected=list(names), layers=records, created_at="2026-11-26T00:00:00Z"
    )
    (folder / CHECKPOINT_FILE).write_text(checkpoint.model_dump_json())
    return checkpoint


def test_a_consistent_checkpoint_loads(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path)
    assert load_checkpoint(tmp_path, step=5) == written


def test_a_capture_that_stopped_between_layers_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, layers=2)
    (tmp_path / "session.tar").write_bytes(b"written, but the crash came before checkpoint.json")
    with pytest.raises(
        EnvironmentStateError, match=r"missing \['session'\]: the capture stopped between layers"
    ):
        load_checkpoint(tmp_path)


def test_a_layer_file_changed_after_the_capture_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path)
    (tmp_path / "sandbox.tar").write_bytes(b"another sandbox")
    with pytest.raises(EnvironmentStateError, match=r"sandbox\.tar's sha256 is not the one recorded"):
        load_checkpoint(tmp_path)


def test_a_layer_file_missing_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path)
    (tmp_path / "environment.tar").unlink()
    with pytest.raises(EnvironmentStateError, match="layer environment"):
        load_checkpoint(tmp_path)


def test_layers_of_different_steps_are_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, steps=(5, 4, 5))
    with pytest.raises(EnvironmentStateError, match="layer sandbox is of step 4"):
        load_checkpoint(tmp_path)


def test_a_checkpoint_of_another_step_or_none_at_all_is_refused(tmp_path: Path) -> None:
    write_checkpoint(tmp_path)
    with pytest.raises(EnvironmentStateError, match="is of step 5, not of step 6"):
        load_checkpoint(tmp_path, step=6)
    with pytest.raises(EnvironmentStateError, match=r"cannot read checkpoint\.json"):
        load_checkpoint(tmp_path / "absent")


async def test_a_checkpoint_of_another_agent_or_task_is_not_restored(tmp_path: Path) -> None:
    """Checked before the sandbox is touched: the sandbox here has nothing but its layout."""
    write_checkpoint(tmp_path)
    sandbox = SimpleNamespace(
        layout=SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/h", agents_dir="/a")
    )
    task = load_task(EXAMPLES / "sqlite-ledger")
    with pytest.raises(EnvironmentStateError, match="is of a on t, not of claude-code on sqlite-ledger"):
        await restore_checkpoint(sandbox, task, get_agent("claude-code"), tmp_path, {}, step=5)  # type: ignore[arg-type]
