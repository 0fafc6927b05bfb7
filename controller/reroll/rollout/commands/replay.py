"""``reroll replay RUN_FOLDER``: check that a recorded run can be rebuilt faithfully by replay.

The run is rebuilt with replay only — a fresh sandbox, every recorded exchange served in order,
no live model — and compared with the original:

- per recorded step, whether the agent's request matched it (the proxy's divergence check, kept
  in the exchange's ``metadata.divergence``; the replayed line names the recorded step it was
  served in ``metadata.replayed_from``: requests are matched by thread, not position), and
  whether the step was reached at all;
- whether the final workspace equals the original's (workspace_manifest.json: sha256 per file;
  the files the agent declares volatile, `reroll.agents.AgentSpec.volatile_files`, by presence);
- whether the rebuild ended as the original did: a finished original (``ok``) must finish by
  itself after its last exchange, a timed-out one asks for more and is stopped at the cut point.

The run is faithful when every recorded step was replayed without divergence, the workspaces
are equal and the endings agree. The report is written to ``fidelity.json`` in the rebuilt run folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from reroll_contracts.errors import RunFolderError
from reroll_contracts.retries import superseded
from reroll_contracts.trajectory import load_trajectory
from rich.console import Console

from reroll.rollout.checkpoint import open_checkpoint
from reroll.rollout.start import FromCheckpoint, start_rollout
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import load_manifest, write_json
from reroll.settings import RolloutSettings

StepVerdict = Literal["match", "diverged", "missing", "retried"]


class StepReport(BaseModel):
    """How one recorded step fared in the replay."""

    step: int
    verdict: StepVerdict
    """``match``: the request equalled the recording; ``diverged``: it differed (served anyway);
    ``missing``: the agent never sent it (it stopped or crashed earlier); ``retried``: an attempt
    the agent's SDK sent again after its connection dropped, never replayed (the retry's answer
    is: `reroll_contracts.retries`)."""
    detail: str = ""
    """The divergence's one-line summary, or why the step is missing."""


class WorkspaceReport(BaseModel):
    """The rebuilt workspace against the original's, by file hash."""

    equal: bool
    files: int
    """Files in the original's manifest."""
    changed: list[str] = []
    volatile: list[str] = []
    """Differing files the agent declares volatile (not counted as changed)."""
    missing: list[str] = []
    """In the original, not in the rebuild."""
    extra: list[str] = []
    """In the rebuild, not in the original."""


class FidelityReport(BaseModel):
    """fidelity.json: the verdict of ``reroll replay``."""

    original: str
    """The original run folder."""
    rebuilt: str
    """The rebuilt run folder."""
    faithful: bool
    steps: list[StepReport]
    workspace: WorkspaceReport | None
    """None when either run has no workspace manifest (e.g. the rebuild failed to start)."""
    original_status: str
    """The original's status (``unknown`` without result.json)."""
    status: str | None
    """The rebuilt rollout's status."""
    same_ending: bool
    """Whether the rebuild ended as the original did (see the module docstring)."""
    error: str | None = None
    """Why the rebuilt rollout ended in error, if it did."""
    original_rewards: dict[str, float] | None = None
    rebuilt_rewards: dict[str, float] | None = None
    """Rewards, when the original finished within its recording (the verifier runs again)."""

    @property
    def matched(self) -> int:
        """Steps whose request matched the recording."""
        return sum(1 for step in self.steps if step.verdict == "match")


async def replay_run(
    run_folder: Path,
    *,
    tasks_dir: Path | None = None,
    options: RolloutSettings = RolloutSettings(),
    output: Path | None = None,
    console: Console | None = None,
) -> FidelityReport:
    """Rebuild `run_folder` by replay only and compare it with the original (``reroll replay``).

    The rebuild is a replay-only continuation of the whole recording
    (`reroll.rollout.start.start_rollout`).

    Args:
        run_folder: the recorded run.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        options: how the rebuild runs (timeout, sandbox, network [default: the original's],
            divergence policy [default: ``warn``, so every step is compared]).
        output: jobs dir of the rebuilt run folder [default: ``<original's parent>/replayed``].
        console: where progress goes [default: ``harness/controller.log`` in the rebuilt folder].

    Returns:
        The report (also written to ``fidelity.json`` in the rebuilt run folder).

    Raises:
        RunFolderError: the folder is missing or corrupt, or it has no workspace_manifest.json
            to compare with.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
        SandboxBackendError: the sandbox backend is unknown, or its package is missing.
        Nothing is written when any of these is raised.
    """
    checkpoint = open_checkpoint(run_folder, tasks_dir=tasks_dir, console=console)
    original = checkpoint.original
    original_manifest = load_manifest(original.path)
    if original_manifest is None:
        raise RunFolderError(
            f"{RunPaths(original.path).manifest}: missing; nothing to compare the rebuild with"
        )
    if console is not None:
        console.print(f"replaying {original.path} ({checkpoint.cut_index} recorded exchanges)")
    outcome = await start_rollout(
        FromCheckpoint(checkpoint, checkpoint.continued_from(None, replay_only=True)),
        live_model=None,
        parent=output or RunPaths(original.path).beside("replayed"),
        name=original.path.name,
        options=options,
        console=console,
    )
    run_dir, result = outcome.run_dir, outcome.result
    retried = superseded(original.exchanges[: checkpoint.cut_index])
    steps = _step_reports(run_dir, checkpoint.cut_index, retried)
    workspace = _compare_workspaces(
        original_manifest, load_manifest(run_dir), checkpoint.agent.volatile_files
    )
    stopped_at_cut = result.error_category == "replay_only"
    same_ending = {"ok": result.status == "ok", "timeout": stopped_at_cut}.get(checkpoint.status, True)
    report = FidelityReport(
        original=str(original.path),
        rebuilt=str(run_dir),
        faithful=all(step.verdict in ("match", "retried") for step in steps)
        and workspace is not None
        and workspace.equal
        and same_ending,
        steps=steps,
        workspace=workspace,
        original_status=checkpoint.status,
        status=result.status,
        same_ending=same_ending,
        # Stopping at the cut point is how a replay of a timed-out run ends: not an error.
        error=result.error if result.status == "error" else None,
        original_rewards=original.result.rewards if original.result else None,
        rebuilt_rewards=result.rewards,
    )
    write_json(RunPaths(run_dir).fidelity, report)
    return report


def _step_reports(run_dir: Path, recorded: int, retried: set[int]) -> list[StepReport]:
    path = RunPaths(run_dir).trajectory
    lines = load_trajectory(path).exchanges if path.is_file() else []
    # Requests are matched to recorded exchanges by thread, not position: each replayed line
    # names the recorded exchange it was served.
    served = {line.metadata.replayed_from: line for line in lines if line.metadata.replayed_from is not None}
    reports = []
    for step in range(recorded):
        if step in retried:
            detail = "its connection dropped; the agent's retry was served instead"
            reports.append(StepReport(step=step, verdict="retried", detail=detail))
        elif step not in served:
            reports.append(
                StepReport(step=step, verdict="missing", detail="the agent never sent this request")
            )
        elif (divergence := served[step].metadata.divergence) is not None:
            reports.append(StepReport(step=step, verdict="diverged", detail=divergence.summary))
        else:
            reports.append(StepReport(step=step, verdict="match"))
    return reports


def _compare_workspaces(
    original: dict[str, str], rebuilt: dict[str, str] | None, volatile_files: Sequence[str] = ()
) -> WorkspaceReport | None:
    if rebuilt is None:
        return None
    differing = sorted(path for path in original.keys() & rebuilt.keys() if original[path] != rebuilt[path])
    volatile = [path for path in differing if any(fnmatch(path, pattern) for pattern in volatile_files)]
    changed = [path for path in differing if path not in volatile]
    missing = sorted(original.keys() - rebuilt.keys())
    extra = sorted(rebuilt.keys() - original.keys())
    return WorkspaceReport(
        equal=not (changed or missing or extra),
        files=len(original),
        changed=changed,
        volatile=volatile,
        missing=missing,
        extra=extra,
    )
