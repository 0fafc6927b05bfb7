"""``reroll replay RUN_FOLDER``: check that a recorded run can be rebuilt faithfully by replay.

The run is rebuilt with replay only — a fresh sandbox, every recorded exchange served in order,
no live model — and compared with the original:

- per step, whether the agent's request matched the recorded one (the proxy's divergence check,
  kept in each exchange's ``metadata.divergence``), and whether the step was reached at all;
- whether the final workspace equals the original's (workspace_manifest.json: sha256 per file);
- whether the rebuild ended as the original did: a finished original (``ok``) must finish by
  itself after its last exchange, a timed-out one asks for more and is stopped at the cut point.

The run is faithful when every recorded step was replayed without divergence, the workspaces
are equal and the endings agree. The report is written to ``fidelity.json`` in the rebuilt run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel
from reroll_proxy.exchange import load_trajectory
from rich.console import Console

from reroll.errors import RunFolderError
from reroll.resume import continuation_plan, open_checkpoint
from reroll.rollout import execute_rollout
from reroll.runfolder import TRAJECTORY, ContinuedFrom, create_run_folder, write_json

MANIFEST = "workspace_manifest.json"
StepVerdict = Literal["match", "diverged", "missing"]


class StepReport(BaseModel):
    """How one recorded step fared in the replay."""

    step: int
    verdict: StepVerdict
    """``match``: the request equalled the recording; ``diverged``: it differed (served anyway);
    ``missing``: the agent never sent it (it stopped or crashed earlier)."""
    detail: str = ""
    """The divergence's one-line summary, or why the step is missing."""


class WorkspaceReport(BaseModel):
    """The rebuilt workspace against the original's, by file hash."""

    equal: bool
    files: int
    """Files in the original's manifest."""
    changed: list[str] = []
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
    output: Path | None = None,
    timeout_seconds: float | None = None,
    sandbox: str | None = None,
    console: Console | None = None,
) -> FidelityReport:
    """Rebuild `run_folder` by replay only and compare it with the original (``reroll replay``).

    Args:
        run_folder: the recorded run.
        tasks_dir: folder holding the task [default: the recorded ``task_path``].
        output: jobs dir of the rebuilt run folder [default: ``<original's parent>/replayed``].
        timeout_seconds: wall-clock budget of the rebuild [default: the original's].
        sandbox: sandbox backend [default: the original's].
        console: where progress goes [default: nowhere].

    Returns:
        The report (also written to ``fidelity.json`` in the rebuilt run folder).

    Raises:
        RunFolderError: the folder is missing or corrupt, or it has no workspace_manifest.json
            to compare with.
        TaskError: the task can be found neither at the recorded path nor in `tasks_dir`.
    """
    console = console or Console(quiet=True)
    checkpoint = open_checkpoint(run_folder, tasks_dir=tasks_dir, at=None, console=console)
    original = checkpoint.original
    original_manifest = _manifest(original.path / MANIFEST)
    if original_manifest is None:
        raise RunFolderError(f"{original.path / MANIFEST}: missing; nothing to compare the rebuild with")
    run_dir = create_run_folder(output or original.path.parent / "replayed", original.path.name)
    provenance = ContinuedFrom(
        path=str(original.path),
        status=checkpoint.status,
        cut_index=checkpoint.cut_index,
        original_model=original.config.model,
        live_model=None,
        replay_only=True,
    )
    plan = continuation_plan(
        checkpoint,
        run_dir=run_dir,
        live_model=None,
        timeout_seconds=timeout_seconds,
        sandbox=sandbox,
        divergence_policy="warn",
        provenance={"continued_from": provenance},
    )
    console.print(f"replaying {original.path} ({checkpoint.cut_index} recorded exchanges)")
    console.print(f"run folder: {run_dir}")
    result = await execute_rollout(plan, console)
    steps = _step_reports(run_dir, checkpoint.cut_index)
    workspace = _compare_workspaces(original_manifest, _manifest(run_dir / MANIFEST))
    stopped_at_cut = result.error_category == "replay_only"
    same_ending = {"ok": result.status == "ok", "timeout": stopped_at_cut}.get(checkpoint.status, True)
    report = FidelityReport(
        original=str(original.path),
        rebuilt=str(run_dir),
        faithful=all(step.verdict == "match" for step in steps)
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
    write_json(run_dir / "fidelity.json", report)
    return report


def _step_reports(run_dir: Path, recorded: int) -> list[StepReport]:
    path = run_dir / TRAJECTORY
    served = load_trajectory(path).exchanges if path.is_file() else []
    reports = []
    for step in range(recorded):
        if step >= len(served):
            reports.append(
                StepReport(step=step, verdict="missing", detail="the agent never sent this request")
            )
        elif (divergence := served[step].metadata.divergence) is not None:
            reports.append(StepReport(step=step, verdict="diverged", detail=divergence.summary))
        else:
            reports.append(StepReport(step=step, verdict="match"))
    return reports


def _manifest(path: Path) -> dict[str, str] | None:
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        raise RunFolderError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object of path → sha256")
    return {str(key): str(value) for key, value in data.items()}


def _compare_workspaces(original: dict[str, str], rebuilt: dict[str, str] | None) -> WorkspaceReport | None:
    if rebuilt is None:
        return None
    changed = sorted(path for path in original.keys() & rebuilt.keys() if original[path] != rebuilt[path])
    missing = sorted(original.keys() - rebuilt.keys())
    extra = sorted(rebuilt.keys() - original.keys())
    return WorkspaceReport(
        equal=not (changed or missing or extra),
        files=len(original),
        changed=changed,
        missing=missing,
        extra=extra,
    )
