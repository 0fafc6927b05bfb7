"""A checkpoint of a live rollout in three layers, and its restore into another sandbox: what a
branch by snapshot forks (seeds/architecture.txt, "The hard part"; DESIGN.md, "The environment
plane").

`capture_checkpoint` quiesces (freezes, then kills) the agent's processes, then copies, in this
order:

1. ``environment`` — the task's ``environment.state`` (`reroll.environment.state.snapshot_state`);
   absent when the task declares none;
2. ``sandbox`` — the workspace, whole (the sandbox's filesystem as the agent changed it);
3. ``session`` — the agent's native session (`AgentSpec.session_paths` under its HOME: Claude
   Code's ``~/.claude``, Codex's ``~/.codex``), which `AgentSpec.resume` continues;
4. ``process`` — a branch's only, of an agent whose conversation is in its memory: its process
   tree, dumped by the caller before the others (`reroll.rollout.process_layer`), its record's
   file ``process.json``; `restore_checkpoint` leaves it to the agent phase.

The folder it writes::

    checkpoint.json       LayeredCheckpoint: the step, the layers expected, one record per layer
                          captured (its file, the file's sha256, the content digest, the step)
    environment.tar       one tar per layer (`reroll.environment.state_script`'s format)
    sandbox.tar
    session.tar

checkpoint.json is rewritten after each layer, so a crash between layers leaves a checkpoint
that lists fewer layers than it expects (and perhaps a layer file it does not list):
`load_checkpoint` refuses it, as it refuses a layer file whose sha256 differs from its record
and layers recorded at different steps. `restore_checkpoint` puts the layers back in the same
order and checks each restored content digest against the one captured.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import EnvironmentStateError

from reroll.agents import AgentSpec
from reroll.environment.state import (
    CopyKind,
    StateCopy,
    restore_paths,
    restore_state,
    snapshot_paths,
    snapshot_state,
)
from reroll.rollout.verify.script_verifier import quiesce
from reroll.runfolder.paths import CHECKPOINT_FILE, PROCESS_RECORD, CheckpointPaths
from reroll.runfolder.run import MAX_JSON_BYTES, now_iso
from reroll.sandbox.base import Sandbox
from reroll.tasks.task import Task

LayerName = Literal["environment", "sandbox", "session", "process"]
LAYER_ORDER: tuple[LayerName, ...] = ("environment", "sandbox", "session", "process")
"""The capture and restore order (the seeds': environment state → container → agent session),
then the agent's process tree where a branch dumped it (`reroll.rollout.process_layer`: dumped
first, listed last, restored by the agent phase)."""
MAX_LAYER_BYTES = 4 * 1024**3
"""The largest layer file of a checkpoint read (each is read whole, no symlink followed)."""


class LayerRecord(BaseModel):
    """One captured layer."""

    name: LayerName
    file: str
    """The layer's tar file, in the checkpoint folder."""
    step: int
    """The step it was captured at (every layer of a checkpoint has the checkpoint's)."""
    sha256: str
    """sha256 hex of the file's bytes."""
    size_bytes: int
    digest: str
    """The content digest at capture (`reroll.environment.state.StateCopy.digest`); a restore must
    reproduce it."""


class LayeredCheckpoint(BaseModel):
    """checkpoint.json: a checkpoint of a rollout after `step` exchanges."""

    step: int
    """How many exchanges the rollout had made: the branch's cut index K."""
    task: str
    agent: str
    expected: list[LayerName]
    """The layers this checkpoint must have (``environment`` only for a task with a state,
    ``session`` only for an agent with `AgentSpec.session_paths`)."""
    layers: list[LayerRecord] = []
    """The layers captured so far, in `LAYER_ORDER`."""
    created_at: str

    @property
    def digests(self) -> dict[str, str]:
        """Each layer's content digest, by layer name."""
        return {layer.name: layer.digest for layer in self.layers}


@dataclass(frozen=True)
class LayerPlan:
    """What one layer copies: a kind and absolute paths in the sandbox (for ``environment``, which
    follows the task's `StateSpec`, its paths when they are files of the sandbox, else none)."""

    name: LayerName
    kind: CopyKind
    paths: list[str]


def layer_plans(sandbox: Sandbox, task: Task, agent: AgentSpec) -> list[LayerPlan]:
    """The layers a checkpoint of `agent` on `task` in `sandbox` has, in `LAYER_ORDER`."""
    layout, state = sandbox.layout, task.spec.environment.state
    plans = []
    if state is not None:  # its paths when they are the sandbox's files (a caller may cover them)
        in_sandbox = state.kind != "command" and state.service is None
        plans.append(LayerPlan("environment", "files", list(state.paths) if in_sandbox else []))
    plans.append(LayerPlan("sandbox", "files", [layout.workspace]))
    if agent.session_paths:
        session = [f"{layout.home.rstrip('/')}/{path.lstrip('/')}" for path in agent.session_paths]
        plans.append(LayerPlan("session", "files", session))
    return plans


def uncovered_layers(
    sandbox: Sandbox, task: Task, agent: AgentSpec, covered: Sequence[str]
) -> list[LayerPlan]:
    """The layers of `layer_plans` that `capture_checkpoint` copies given `covered` (sandbox paths
    the caller keeps otherwise): none when they cover every layer, and then a capture touches
    nothing of the sandbox (it only writes ``checkpoint.json``)."""
    return [plan for plan in layer_plans(sandbox, task, agent) if not _covered(plan, covered)]


async def capture_checkpoint(
    sandbox: Sandbox,
    task: Task,
    agent: AgentSpec,
    step: int,
    folder: Path,
    env: dict[str, str],
    *,
    quiesce_agent: bool = True,
    covered: Sequence[str] = (),
    process: bytes | None = None,
) -> LayeredCheckpoint:
    """Quiesce the agent and capture its rollout's layers at `step` into `folder` (the module
    docstring).

    Args:
        sandbox: the rollout's started sandbox.
        task: its task (``environment.state`` says what the environment layer is).
        agent: its agent (``session_paths`` say what the session layer is).
        step: how many exchanges the rollout made.
        folder: the checkpoint folder on the host (created; an earlier checkpoint there is replaced).
        env: the base environment of processes in the sandbox (PATH).
        quiesce_agent: freeze and kill the agent's processes first; False: the caller holds the
            agent otherwise (the proxy holds its model request: ``--checkpoint-every``).
        covered: sandbox paths the caller keeps otherwise (a pool snapshot of the workspace and
            HOME): a layer whose paths all lie in them is not captured (nor expected).
        process: ``process.json`` of the agent's tree the caller dumped into `folder`
            (`reroll.rollout.process_layer.dump_process`): recorded as the ``process`` layer.

    Returns:
        The checkpoint as written to ``folder/checkpoint.json``.

    Raises:
        QuiesceError: the agent's processes outlived the quiesce.
        EnvironmentStateError: a layer could not be copied (a planted link, a failed command...).
    """
    if quiesce_agent:
        await quiesce(sandbox)  # nothing of the agent runs while the layers are copied
    folder.mkdir(parents=True, exist_ok=True)
    files = CheckpointPaths(folder)
    plans = uncovered_layers(sandbox, task, agent, covered)
    names: list[LayerName] = [plan.name for plan in plans] + ["process"] * (process is not None)
    checkpoint = LayeredCheckpoint(
        step=step, task=task.name, agent=agent.name, expected=names, created_at=now_iso()
    )
    _write_atomic(files.record, checkpoint.model_dump_json(indent=2).encode())
    for plan in plans:
        copy = await _copy_out(sandbox, task, plan, env)
        name = f"{plan.name}.tar"
        _write_atomic(files.layer(name), copy.data)
        checkpoint.layers.append(
            LayerRecord(
                name=plan.name,
                file=name,
                step=step,
                sha256=hashlib.sha256(copy.data).hexdigest(),
                size_bytes=len(copy.data),
                digest=copy.digest,
            )
        )
        _write_atomic(files.record, checkpoint.model_dump_json(indent=2).encode())
    if process is not None:
        record = LayerRecord(
            name="process", file=PROCESS_RECORD, step=step, sha256=hashlib.sha256(process).hexdigest(),
            size_bytes=len(process), digest=hashlib.sha256(process).hexdigest(),
        )  # fmt: skip
        checkpoint.layers.append(record)
        _write_atomic(files.record, checkpoint.model_dump_json(indent=2).encode())
    return checkpoint


def load_checkpoint(folder: Path, *, step: int | None = None) -> LayeredCheckpoint:
    """Read and check the checkpoint in `folder`: every expected layer present, in order, each
    file's sha256 its record's, every layer of the checkpoint's step (and of `step` if given).

    Raises:
        EnvironmentStateError: the checkpoint is missing, unreadable or inconsistent (named).
    """
    path = CheckpointPaths(folder).record
    try:
        checkpoint = LayeredCheckpoint.model_validate_json(read_data_file(path, MAX_JSON_BYTES))
    except (OSError, ValueError) as exc:  # ValueError: ValidationError, DataFileError
        raise EnvironmentStateError(f"checkpoint {folder}: cannot read {CHECKPOINT_FILE}: {exc}") from exc
    names = [layer.name for layer in checkpoint.layers]
    if names != checkpoint.expected:
        missing = [name for name in checkpoint.expected if name not in names]
        raise EnvironmentStateError(
            f"checkpoint {folder} is inconsistent: it expects the layers {checkpoint.expected} but holds "
            f"{names}" + (f" (missing {missing}: the capture stopped between layers)" if missing else "")
        )
    if step is not None and checkpoint.step != step:
        raise EnvironmentStateError(f"checkpoint {folder} is of step {checkpoint.step}, not of step {step}")
    for layer in checkpoint.layers:
        if layer.step != checkpoint.step:
            raise EnvironmentStateError(
                f"checkpoint {folder} is inconsistent: layer {layer.name} is of step {layer.step}, "
                f"the checkpoint of step {checkpoint.step}"
            )
        try:
            data = read_data_file(CheckpointPaths(folder).layer(layer.file), MAX_LAYER_BYTES, root=folder)
        except (OSError, ValueError) as exc:  # ValueError: DataFileError
            raise EnvironmentStateError(f"checkpoint {folder}: layer {layer.name}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != layer.sha256:
            raise EnvironmentStateError(
                f"checkpoint {folder} is inconsistent: {layer.file}'s sha256 is not the one recorded"
            )
    return checkpoint


async def restore_checkpoint(
    sandbox: Sandbox,
    task: Task,
    agent: AgentSpec,
    folder: Path,
    env: dict[str, str],
    *,
    step: int,
    given: Sequence[str] = (),
) -> LayeredCheckpoint:
    """Check the checkpoint in `folder` (`load_checkpoint`) and put its file layers into `sandbox`
    (a fresh sandbox of the same task, before the agent starts), in `LAYER_ORDER` (a ``process``
    layer is the agent phase's: `reroll.rollout.process_layer`); a layer whose
    paths all lie in `given` (sandbox paths the sandbox started with as of that step: a kept
    pool's snapshot) is left as it is, and may be absent from the checkpoint (one captured with
    those paths `covered`).

    Returns:
        The checkpoint; each restored layer's digest equals its record's.

    Raises:
        EnvironmentStateError: the checkpoint is inconsistent, is of another agent or task, has
            other layers than this rollout would capture, or a restored layer's digest differs.
    """
    checkpoint = load_checkpoint(folder, step=step)
    plans = layer_plans(sandbox, task, agent)
    if (checkpoint.task, checkpoint.agent) != (task.name, agent.name):
        raise EnvironmentStateError(
            f"checkpoint {folder} is of {checkpoint.agent} on {checkpoint.task}, "
            f"not of {agent.name} on {task.name}"
        )
    needed = [plan for plan in plans if not _covered(plan, given)]
    expected = [name for name in checkpoint.expected if name != "process"]  # the agent phase's
    if expected not in ([plan.name for plan in plans], [plan.name for plan in needed]):
        raise EnvironmentStateError(
            f"checkpoint {folder} has the layers {checkpoint.expected}; "
            f"this rollout needs {[p.name for p in needed]}"
        )
    layers = {layer.name: layer for layer in checkpoint.layers}
    for plan in needed:
        layer = layers[plan.name]
        data = read_data_file(CheckpointPaths(folder).layer(layer.file), MAX_LAYER_BYTES, root=folder)
        if plan.name == "environment":
            state = task.spec.environment.state
            assert state is not None
            restored = await restore_state(sandbox, state, data, env)
        else:
            restored = await restore_paths(sandbox, plan.kind, plan.paths, data, env)
        if restored != layer.digest:
            raise EnvironmentStateError(
                f"checkpoint {folder}: layer {layer.name} restored to content {restored[:12]}, "
                f"captured as {layer.digest[:12]}"
            )
    return checkpoint


def _covered(plan: LayerPlan, folders: Sequence[str]) -> bool:
    """Whether every path of `plan` lies in `folders` (the environment's layer never does)."""
    return bool(plan.paths) and all(_within(path, folders) for path in plan.paths)


def _within(path: str, folders: Sequence[str]) -> bool:
    """Whether sandbox path `path` is one of `folders` or lies in one."""
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


async def _copy_out(sandbox: Sandbox, task: Task, plan: LayerPlan, env: dict[str, str]) -> StateCopy:
    if plan.name == "environment":
        state = task.spec.environment.state
        assert state is not None
        return await snapshot_state(sandbox, state, env)
    return await snapshot_paths(sandbox, plan.kind, plan.paths, env)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all (a temporary file renamed, fsynced)."""
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)
