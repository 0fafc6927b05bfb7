"""Checkpoints as a rollout extension: the layers (environment state, workspace, agent session:
`reroll.rollout.layers`) captured every ``checkpoint_every`` steps while the agent runs live, and
a branch forked by snapshot restored from a checkpoint's layers before its agent resumes.

A checkpoint at every step by default (``checkpoint_keep``, ``--checkpoint-keep``: 64 kept; 0
turns it off), where it is cheap: a new recording on the isolated ``local`` sandbox with a
copy-on-write disk and ``checkpoint_every`` 0 takes a pool snapshot of the workspace, HOME and
``/`` at every live step (bytes changed only). Its proxy takes it itself, the request waiting
for the three btrfs ioctls only (`_let_the_proxy_freeze`: about 4 ms a step, no round trip to
the controller); where the task's environment state lies outside the snapshot (a service's, a
command's), the proxy holds the request while the controller snapshots (`pool_snapshot`) and
copies that layer (the task's own cost). Either way the checkpoint's files are written after the
request went on; ``harness/checkpoint-holds.json`` says how long each waited. The sandbox then
keeps its disk as a pool when it stops. `retained` says which of those checkpoints the run
keeps. On ``docker`` with a copy-on-write disk (`reroll.sandbox.docker.cowdisk`) the same, but the
proxy always holds: the controller freezes the sized folders and copies the container's own layer.
Elsewhere (ext4, the plain fallback) nothing changes: no tar layers every step, nothing said.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from reroll_contracts.btrfs import PATHS
from reroll_contracts.errors import RerollError, SandboxError
from reroll_contracts.proxy import FreezePlan, HeldStep

from reroll.host.llm_proxy import LlmProxy
from reroll.rollout.hooks import Draft, Extension, Run, TurnLaunch
from reroll.rollout.layers import capture_checkpoint, restore_checkpoint, uncovered_layers
from reroll.rollout.llm_side import port_of
from reroll.rollout.origin import FromCheckpoint, NewRecording
from reroll.rollout.process_layer import (
    ProcessLayer,
    dump_process,
    read_process_layer,
    restore_process_files,
    run_restored,
)
from reroll.rollout.turns.scenes import AgentOutcome
from reroll.runfolder.paths import CheckpointPaths
from reroll.runfolder.run import write_json
from reroll.sandbox.docker import disk
from reroll.sandbox.docker.config import DockerSandboxConfig
from reroll.sandbox.docker.cowdisk import LAYER
from reroll.sandbox.local import cow
from reroll.sandbox.local.criu import raise_next_pid
from reroll.sandbox.local.rootview import namespaces_unavailable
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.sandbox.local.storage import PoolSnapshot, frozen_paths, mark_pool


class Checkpoints(Extension):
    """Options read: ``checkpoint_every`` (`reroll.settings.RolloutSettings`); the origin's
    layers (`reroll.rollout.origin.FromCheckpoint.layers`)."""

    def __init__(self) -> None:
        self.every = 0
        self.pool_only = False
        """A checkpoint at every step (``checkpoint_keep``, `pool_checkpoints_apply`): pool snapshots only."""
        self.keep = 0
        self.kept: list[int] = []
        """The steps whose checkpoint the run keeps so far (`retained`)."""
        self.restore_from: Path | None = None
        self.restore_step = 0
        self.from_pool: str | None = None
        """The kept pool snapshot a fork's sandbox started from (`FromCheckpoint.pool`)."""
        self.capturing: asyncio.Task[None] | None = None
        self.held: dict[int, float] = {}
        """Seconds each step's request was held, as the proxy measured it (`RunPaths.checkpoint_holds`)."""
        self.filing: asyncio.Task[None] | None = None
        """The files of the latest per-step pool checkpoint being written (`_file_pool_checkpoint`)."""
        self.freezing: FreezePlan | None = None
        """What the proxy freezes at each step itself (`_let_the_proxy_freeze`), None: it holds."""
        self.froze: dict[int, float] = {}
        """Seconds of each step's held part on the controller's side (``capture`` in the holds file)."""
        self.dump_process = False
        """Dump the agent's process tree at each held step (`FromCheckpoint.dump_process`)."""
        self.process: ProcessLayer | None = None
        """The origin's process layer, restored instead of launching the agent (a fork of it)."""

    def configure(self, draft: Draft) -> None:
        """Have the proxy hold every ``checkpoint_every``-th step (also at the cut of a
        replay-only rollout when it is such a step: a branch's rebuilt prefix), or every step
        where that is cheap and ``checkpoint_keep`` asks for it (`pool_checkpoints_apply`)."""
        self.every = draft.settings.checkpoint_every
        if not self.every and draft.settings.checkpoint_keep and pool_checkpoints_apply(draft):
            self.every, self.pool_only, self.keep = 1, True, max(2, draft.settings.checkpoint_keep)
        draft.hold_every = self.every
        if isinstance(draft.origin, FromCheckpoint):
            self.restore_from = draft.origin.layers
            self.restore_step = draft.origin.layers_step or draft.origin.checkpoint.cut_index
            self.from_pool = draft.origin.pool
            self.dump_process = draft.origin.dump_process
            if self.restore_from is not None:
                self.process = read_process_layer(self.restore_from)
                draft.proxy_token = self.process.token if self.process is not None else None

    async def before_agent(self, run: Run) -> None:
        """Restore the origin's layers (a fork), then start capturing while the agent runs."""
        plan, env = run.plan, run.env | run.task_env
        if self.restore_from is not None:
            run.console.print(f"[dim]restoring the checkpoint layers of step {self.restore_step}[/dim]")
            given = pool_covers(run, self.from_pool) if self.from_pool else []
            restored = await restore_checkpoint(
                run.sandbox,
                plan.task,
                plan.agent,
                self.restore_from,
                env,
                step=self.restore_step,
                given=given,
            )
            if self.process is not None and run.proxy is not None:
                port = port_of(run.proxy.base_url)
                await restore_process_files(run.sandbox, self.restore_from, self.process, env, port)
            plan.paths.make_harness()
            write_json(plan.paths.restored_checkpoint, restored)
            await run.hooks.at_restore(run, self.restore_step, self.restore_from)
        if self.dump_process:  # its tree's pids free in every fresh sandbox (`raise_next_pid`)
            await raise_next_pid(run.sandbox)  # type: ignore[arg-type]  # refused by the dump if not isolated
        if run.proxy is not None and self.every:
            if self.pool_only:
                self.freezing = await _let_the_proxy_freeze(run, run.proxy)
            self.capturing = asyncio.create_task(self._capture(run, run.proxy, env))
            run.stack.push_async_callback(self._stop)

    async def before_turn(self, run: Run, launch: TurnLaunch) -> None:
        """A fork's every turn continues the restored session; a fork of a process layer's first
        turn waits for the restored tree instead of launching the agent."""
        launch.resume = launch.resume or self.restore_from is not None
        if self.process is not None and self.restore_from is not None:
            launch.restored = functools.partial(run_restored, run.sandbox, self.restore_from, self.process)
            self.process = None

    async def after_agent(self, run: Run, outcome: AgentOutcome) -> None:
        """Stop capturing (before the proxy stops), file the steps the proxy froze unseen
        (`_file_unseen`); write how long each step was held (`RunPaths.checkpoint_holds`)."""
        await self._stop()
        await self._file_unseen(run)
        if self.held:
            held = {
                "steps": list(self.held),
                "seconds": [round(s, 6) for s in self.held.values()],
                "capture": [round(self.froze.get(step, 0.0), 6) for step in self.held],
            }
            run.plan.paths.make_harness()
            write_json(run.plan.paths.checkpoint_holds, held)

    async def _capture(self, run: Run, proxy: LlmProxy, env: dict[str, str]) -> None:
        """Each time the proxy holds a request at a step boundary, capture the layers into
        ``checkpoints/step-K/`` and let the request go on. The agent waits for its model
        meanwhile: its conversation is quiescent (a process it left running in the background is
        not frozen). A per-step pool checkpoint (`pool_only`) holds the request only for what
        touches the sandbox: where the proxy freezes it itself (`_let_the_proxy_freeze`) only for
        those ioctls, with no round trip; else for the pool snapshot and the layers it does not
        cover. Its files (``pool.json``, ``checkpoint.json``) are written after the request went
        on. A failed capture is reported, the run goes on (a branch refuses the incomplete
        checkpoint and rebuilds the prefix)."""
        plan = run.plan
        while True:
            held = await proxy.wait_for_held()
            step, began = held.step, time.perf_counter()
            folder = plan.paths.checkpoint(step).root
            reference: str | None = None
            if held.frozen:
                reference = self._frozen(run, held)
            else:
                reference = await self._held_capture(run, proxy, step, folder, env, began)
            if reference is not None:  # off the hold, one after the other: the next hold waits for none
                filed = self._file_pool_checkpoint(run, step, folder, reference, env, self.filing)
                self.filing = asyncio.create_task(filed)

    def _frozen(self, run: Run, held: HeldStep) -> str | None:
        """A step the proxy froze itself: note how long it waited; the snapshot's reference, None
        when it failed (reported)."""
        self.held[held.step] = self.froze[held.step] = held.held_seconds or 0.0
        adopt = getattr(run.sandbox, "adopt_pool_snapshot", None)
        if held.error is not None or adopt is None:
            run.console.print(f"[yellow]checkpoint of step {held.step} failed: {held.error}[/yellow]")
            return None
        reference: str | None = adopt(f"step-{held.step}")
        return reference

    async def _held_capture(
        self, run: Run, proxy: LlmProxy, step: int, folder: Path, env: dict[str, str], began: float
    ) -> str | None:
        """Capture the checkpoint of held step `step`, then release it: the pool snapshot's
        reference when a per-step one was taken (its files still to write), else None."""
        reference: str | None = None
        try:
            if self.pool_only:
                reference = await self._freeze(run, step, folder, env)
            else:
                await self._checkpoint(run, step, folder, env)
        except RerollError as exc:
            run.console.print(f"[yellow]checkpoint of step {step} failed: {exc}[/yellow]")
        finally:
            self.froze[step] = time.perf_counter() - began
            self.held[step] = await proxy.release(step)
        return reference

    async def _checkpoint(self, run: Run, step: int, folder: Path, env: dict[str, str]) -> None:
        """A ``checkpoint_every`` checkpoint of `step` (the request held): its layers as tar files
        into `folder`, and a pool snapshot beside them where the sandbox keeps one."""
        plan = run.plan
        process = None
        if self.dump_process and run.proxy is not None:  # first: its files as it left them
            layer, process = await dump_process(run.sandbox, run.proxy.base_url, run.proxy.token, folder, env)
            run.console.print(
                f"[dim]the agent's process tree dumped in {layer.dump_seconds:.2f} s, "
                f"{layer.images_bytes / 1e6:.1f} MB of images[/dim]"
            )
        await capture_checkpoint(
            run.sandbox, plan.task, plan.agent, step, folder, env, quiesce_agent=False, process=process
        )
        await _keep_in_pool(run, step, folder)
        run.console.print(f"[dim]checkpoint of step {step}: {folder}[/dim]")
        await run.hooks.at_checkpoint(run, step, folder)

    async def _freeze(self, run: Run, step: int, folder: Path, env: dict[str, str]) -> str | None:
        """The part of a per-step pool checkpoint that needs the request held: the pool snapshot
        (`pool_snapshot`), and the layers it does not cover (an environment state kept by a
        service or a command: their tar files into `folder`). The snapshot's reference, None
        when the sandbox keeps none after all."""
        plan = run.plan
        snapshot = getattr(run.sandbox, "pool_snapshot", None)
        reference: str | None = None if snapshot is None else await snapshot(f"step-{step}")
        if reference is None:
            return None
        covered = pool_covers(run, reference)
        if uncovered_layers(run.sandbox, plan.task, plan.agent, covered):
            await capture_checkpoint(
                run.sandbox, plan.task, plan.agent, step, folder, env, quiesce_agent=False, covered=covered
            )
        return reference

    async def _file_pool_checkpoint(
        self,
        run: Run,
        step: int,
        folder: Path,
        reference: str,
        env: dict[str, str],
        after: asyncio.Task[None] | None,
    ) -> None:
        """After the release and once `after` (the previous step's filing) is done: write the
        pool checkpoint of `step` taken by `_freeze` (``pool.json``, ``checkpoint.json`` when
        `_freeze` captured no layer, the pool's `RUN_FILE`), then apply the retention
        (`_retain`). A failure is reported, the run goes on."""
        if after is not None:
            await after
        try:
            await self._file(run, step, folder, reference, env)
        except RerollError as exc:
            run.console.print(f"[yellow]checkpoint of step {step} failed: {exc}[/yellow]")

    async def _file(self, run: Run, step: int, folder: Path, reference: str, env: dict[str, str]) -> None:
        """`_file_pool_checkpoint`'s work. Raises RerollError as `capture_checkpoint`, SandboxError
        when the files cannot be written."""
        plan = run.plan
        covered = pool_covers(run, reference)
        try:
            await asyncio.to_thread(_write_pool_file, folder, reference, plan.run_dir)
        except OSError as exc:
            raise SandboxError(f"marking the pool of {reference}: {exc}") from exc
        if not uncovered_layers(run.sandbox, plan.task, plan.agent, covered):  # touches no sandbox file
            await capture_checkpoint(
                run.sandbox, plan.task, plan.agent, step, folder, env, quiesce_agent=False, covered=covered
            )
        await self._retain(run, step)
        await run.hooks.at_checkpoint(run, step, folder)

    async def _retain(self, run: Run, step: int) -> None:
        """Add `step` to the kept checkpoints and drop those `retained` lets go (their pool
        snapshot and folder)."""
        self.kept.append(step)
        keep = retained(self.kept, self.keep)
        drop = getattr(run.sandbox, "drop_pool_snapshot", None)  # there: it took a pool snapshot
        for dropped in [kept for kept in self.kept if kept not in keep]:
            if drop is not None:
                await drop(f"step-{dropped}")
            shutil.rmtree(run.plan.paths.checkpoint(dropped).root, ignore_errors=True)
        self.kept = [kept for kept in self.kept if kept in keep]

    async def _file_unseen(self, run: Run) -> None:
        """File the steps the proxy froze whose news the agent's end cut off (its last requests'
        `HeldStep` still on the way when capturing stopped): found on the disk, a
        `FreezePlan.step_folder` holding its `reroll_contracts.btrfs.PATHS`, as `_capture` files
        the others (their wait unknown: not in ``harness/checkpoint-holds.json``)."""
        plan, adopt = self.freezing, getattr(run.sandbox, "adopt_pool_snapshot", None)
        if plan is None or adopt is None:
            return
        found = [folder for folder in plan.snapshots.glob("step-*") if (folder / PATHS).is_file()]
        steps = sorted(int(name[5:]) for name in (folder.name for folder in found) if name[5:].isdigit())
        for step in [step for step in steps if step not in self.held and step > max(self.kept, default=0)]:
            reference = adopt(f"step-{step}")
            if reference is not None:
                folder = run.plan.paths.checkpoint(step).root
                await self._file_pool_checkpoint(run, step, folder, reference, run.env | run.task_env, None)

    async def _stop(self) -> None:
        """Cancel the capturing task, if any (once), and wait for the checkpoint files it left
        being written."""
        capturing, self.capturing = self.capturing, None
        if capturing is not None:
            capturing.cancel()
            with contextlib.suppress(asyncio.CancelledError, RerollError):
                await capturing
        filing, self.filing = self.filing, None
        if filing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await filing


async def _let_the_proxy_freeze(run: Run, proxy: LlmProxy) -> FreezePlan | None:
    """Where the sandbox can say what its pool snapshot freezes (`pool_freeze_plan`: the isolated
    ``local`` sandbox with copy-on-write) and that snapshot covers every layer of a checkpoint (no
    environment state outside it), have the proxy take it itself at each held step
    (`reroll.host.llm_proxy.LlmProxy.freeze_at_holds`): the request then waits for the ioctls
    only, with no round trip to the controller. Elsewhere, or when the proxy refuses the plan
    (reported), the proxy holds as before. The plan the proxy took, None: it holds.
    """
    plan_of = getattr(run.sandbox, "pool_freeze_plan", None)
    plan: FreezePlan | None = plan_of() if plan_of is not None else None
    if plan is None:
        return None
    layout = run.sandbox.layout
    covered = [layout.workspace, layout.home] + ["/"] * (plan.root is not None)
    if uncovered_layers(run.sandbox, run.plan.task, run.plan.agent, covered):
        return None
    try:
        await proxy.freeze_at_holds(plan)
    except RerollError as exc:
        run.console.print(f"[yellow]the proxy will hold each step instead of freezing it: {exc}[/yellow]")
        return None
    return plan


def pool_checkpoints_apply(draft: Draft) -> bool:
    """Whether the rollout of `draft` can keep a pool checkpoint at every step: a new
    recording (not a continuation or branch: their pools would crowd the recordings' out,
    `reroll.sandbox.local.storage.POOL_KEEP_COUNT`) of agents that call a model, on the isolated
    ``local`` sandbox or ``docker`` (`reroll.sandbox.docker.cowdisk`) with a copy-on-write disk and
    ``keep_snapshots`` not False."""
    config = draft.settings.sandbox_config
    if draft.config.sandbox == "local":
        backend_applies = isinstance(config, IsolatedSandboxConfig) and not namespaces_unavailable()
    else:
        backend_applies = draft.config.sandbox == "docker" and isinstance(config, DockerSandboxConfig)
    return (
        isinstance(draft.origin, NewRecording)
        and backend_applies
        and isinstance(config, IsolatedSandboxConfig | DockerSandboxConfig)
        and config.keep_snapshots is not False
        and config.copy_on_write
        and all(agent.api_format != "none" for agent in draft.agents.values())
        and cow.available()
    )


def retained(steps: Sequence[int], keep: int) -> set[int]:
    """The steps of `steps` (step numbers from 1, ascending) whose per-step checkpoint a run keeps
    (``checkpoint_keep`` = `keep`, >= 2): all of them up to step `keep`; beyond, those of the latest
    ``keep // 2`` steps and, of the earlier ones, the multiples of the smallest power-of-two stride
    of which at most the rest fit below. At most `keep` in all; a step let go never comes back (the
    stride only grows), and a branch at any step finds a kept one at most a stride before it.
    """
    last = steps[-1] if steps else 0
    if last <= keep:
        return set(steps)
    boundary, budget, stride = last - keep // 2, keep - keep // 2, 1
    while boundary // stride > budget:
        stride *= 2
    return {step for step in steps if step > boundary or step % stride == 0}


async def _keep_in_pool(run: Run, step: int, folder: Path) -> str | None:
    """Where the sandbox can keep a copy-on-write snapshot beyond its life (`pool_snapshot`: the
    isolated ``local`` sandbox with copy-on-write), take ``step-K`` of the workspace, HOME and
    ``/`` and write its reference into `folder`'s ``pool.json`` (and the run folder into the pool:
    `reroll.sandbox.local.storage.mark_pool`); the reference, None when there is no pool."""
    pool_snapshot = getattr(run.sandbox, "pool_snapshot", None)
    reference: str | None = None if pool_snapshot is None else await pool_snapshot(f"step-{step}")
    if reference is None:
        return None
    try:
        _write_pool_file(folder, reference, run.plan.run_dir)
    except OSError as exc:
        raise SandboxError(f"marking the pool of {reference}: {exc}") from exc
    return reference


def _write_pool_file(folder: Path, reference: str, run_dir: Path) -> None:
    """Write `reference` into `folder`'s ``pool.json`` and `run_dir` into its pool
    (`reroll.sandbox.local.storage.mark_pool`). Raises OSError when either cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    write_json(CheckpointPaths(folder).pool, {"from_snapshot": reference})
    mark_pool(reference, run_dir)


def pool_covers(run: Run, reference: str) -> list[str]:
    """The sandbox paths the pool snapshot `reference` (``<pool>:<name>``) holds: those it froze
    (its `PATHS`: local's workspace and HOME, docker's sized folders), and ``/`` when it froze
    that (`reroll.sandbox.local.storage.PoolSnapshot.root`) or the container's layer
    (`reroll.sandbox.docker.cowdisk.LAYER`): the layers whose paths lie in them are neither
    captured nor restored."""
    folder, _, name = reference.rpartition(":")
    source = PoolSnapshot(Path(folder), name)
    try:
        paths = [path for path, _ in frozen_paths(source)]
    except OSError:
        paths = [run.sandbox.layout.workspace, run.sandbox.layout.home]
    whole = source.root is not None or cow.is_subvolume(source.frozen / LAYER)
    return paths + ["/"] * whole


def pool_reference(folder: Path) -> str | None:
    """The ``<pool>:step-K`` a checkpoint `folder` recorded (``pool.json``), or None when it has none
    or the file is unreadable. Whether the pool still exists is the caller's to check
    (`reroll.sandbox.local.storage.PoolSnapshot.parse`: a pruned pool raises SandboxError)."""
    try:
        data = json.loads(CheckpointPaths(folder).pool.read_text())
    except (OSError, ValueError):
        return None
    reference = data.get("from_snapshot") if isinstance(data, dict) else None
    return reference if isinstance(reference, str) else None


def kept_pool(layers: Path, sandbox: str) -> tuple[str | None, str | None]:
    """The kept copy-on-write snapshot recorded with checkpoint `layers` (`pool_reference`) that
    children on `sandbox` can start from, and a note when one was recorded but cannot be used (its
    pool pruned, or another backend than the one that kept it: ``docker`` for a pool named
    `reroll.sandbox.docker.disk.PREFIX`…, else ``local``; the tar layers are restored then)."""
    reference = pool_reference(layers)
    if reference is None:
        return None, None
    needs = "docker" if Path(reference.rpartition(":")[0]).name.startswith(disk.PREFIX) else "local"
    if sandbox != needs:
        return None, f"the pool snapshot {reference} needs the {needs} sandbox; restoring the layers"
    try:
        PoolSnapshot.parse(reference)
    except SandboxError:
        return None, f"the pool snapshot {reference} is gone (pruned?); restoring the layers"
    return reference, f"children start from the pool snapshot {reference}"
