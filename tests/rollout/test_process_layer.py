"""The ``process`` layer of a checkpoint (an agent's process tree, `reroll.rollout.process_layer`):
listed last in checkpoint.json, checked like the file layers, left to the agent phase by a
restore; its record read back, a malformed one refused."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from reroll.agents import get_agent
from reroll.rollout.layers import capture_checkpoint, load_checkpoint, restore_checkpoint
from reroll.rollout.process_layer import ProcessLayer, read_process_layer
from reroll.runfolder.paths import CheckpointPaths
from reroll.sandbox.layout import SandboxLayout
from reroll.tasks.task import load_task
from reroll_contracts.errors import EnvironmentStateError

from tests.conftest import EXAMPLES

LAYOUT = SandboxLayout(root="/", workspace="/app", logs_dir="/logs", home="/h", agents_dir="/a")
LAYER = ProcessLayer(
    root_pid=100_000, address="127.0.0.9", port=4321, token="secret", pipes={1: "pipe:[7]"},
    open_files=["/logs/agent/x.log"], files_sha256="0" * 64, files_digest="d", images_bytes=10,
    dump_seconds=0.1,
)  # fmt: skip


async def capture(folder: Path) -> bytes:
    """A checkpoint of mini-swe-agent on fix-failing-test at step 2 whose workspace a pool keeps
    (so no sandbox is touched), with a process layer."""
    process = LAYER.model_dump_json().encode()
    folder.mkdir()
    CheckpointPaths(folder).process_record.write_bytes(process)
    sandbox = SimpleNamespace(layout=LAYOUT)
    task, agent = load_task(EXAMPLES / "fix-failing-test"), get_agent("mini-swe-agent")
    await capture_checkpoint(
        sandbox,  # type: ignore[arg-type]  # a stand-in: the pool keeps the workspace, no sandbox call
        task,
        agent,
        2,
        folder,
        {},
        quiesce_agent=False,
        covered=["/app"],
        process=process,
    )
    return process


async def test_the_process_layer_is_listed_last_and_checked(tmp_path: Path) -> None:
    process = await capture(tmp_path / "step-2")
    checkpoint = load_checkpoint(tmp_path / "step-2", step=2)
    assert checkpoint.expected == ["process"]
    (record,) = checkpoint.layers
    assert (record.name, record.file, record.step) == ("process", "process.json", 2)
    assert record.sha256 == hashlib.sha256(process).hexdigest()
    CheckpointPaths(tmp_path / "step-2").process_record.write_bytes(process.replace(b"4321", b"4322"))
    with pytest.raises(EnvironmentStateError, match=r"process\.json.s sha256 is not the one recorded"):
        load_checkpoint(tmp_path / "step-2", step=2)


async def test_a_restore_leaves_the_process_layer_to_the_agent_phase(tmp_path: Path) -> None:
    await capture(tmp_path / "step-2")
    sandbox = SimpleNamespace(layout=LAYOUT)  # nothing but a layout: no file layer to restore
    task, agent = load_task(EXAMPLES / "fix-failing-test"), get_agent("mini-swe-agent")
    restored = await restore_checkpoint(sandbox, task, agent, tmp_path / "step-2", {}, step=2, given=["/app"])  # type: ignore[arg-type]
    assert restored.digests.keys() == {"process"}
    assert read_process_layer(tmp_path / "step-2") == LAYER


def test_a_checkpoint_without_a_process_layer_has_none_and_a_malformed_one_is_refused(
    tmp_path: Path,
) -> None:
    assert read_process_layer(tmp_path) is None
    CheckpointPaths(tmp_path).process_record.write_text('{"root_pid": "x"}')
    with pytest.raises(EnvironmentStateError, match=r"cannot read process\.json"):
        read_process_layer(tmp_path)
    assert "secret" not in repr(LAYER), "the token is never printed"
