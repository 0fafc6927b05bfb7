"""``branch --via snapshot`` from a run recorded on ``local`` with ``keep_snapshots``: each
checkpoint keeps a copy-on-write pool snapshot, the children start from it (``from_snapshot``,
not recorded in their config.json) with the state at step K; once the pool is pruned, the
children fall back to restoring the tar layers, with a note. A run recorded with no flag keeps a
pool checkpoint at every step (as ``checkpoint_keep`` retains them), frozen by its proxy with no
round trip to the controller; a branch at such a step starts from it, one at a step it let go
from the nearest earlier one, replaying the remainder."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from reroll.jobs.branch import branch
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import model_slug
from reroll.rollout.commands.record import run_task
from reroll.rollout.extensions.checkpoints import (
    kept_pool,
    pool_reference,
    retained,
)
from reroll.rollout.layers import load_checkpoint
from reroll.runfolder.run import CHECKPOINTS_DIR, HELD_FILE, harness_folder
from reroll.sandbox.docker import disk
from reroll.sandbox.local import cow, rootview, storage
from reroll.sandbox.local.settings import IsolatedSandboxConfig
from reroll.settings import RolloutSettings

from tests.jobs.test_branch_snapshot import CUT, LEDGER, ledger_script, session_agent

__all__ = ["session_agent"]  # the fixture, shared
REROLL = str(Path(sys.executable).parent / "reroll")

pytestmark = [
    pytest.mark.spawns,
    pytest.mark.skipif(bool(rootview.namespaces_unavailable()), reason="this machine forbids namespaces"),
    pytest.mark.skipif(not cow.available(), reason="btrfs-progs (mkfs.btrfs) is not installed"),
]


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, session_agent: str) -> Iterator[Path]:
    """A six-step run of the ledger task on local keeping its snapshots, a checkpoint every `CUT`
    steps; its pool removed afterwards."""
    folder = tmp_path_factory.mktemp("original")
    options = RolloutSettings(
        sandbox="local", checkpoint_every=CUT, sandbox_config=IsolatedSandboxConfig(keep_snapshots=True)
    )
    recording = run_task(
        LEDGER,
        agent_name=session_agent,
        model=ledger_script(folder, "original", 6),
        options=options,
        jobs_dir=folder / "jobs",
    )
    outcome = asyncio.run(recording)
    assert outcome.result.status == "ok", outcome.result.error
    reference = pool_reference(outcome.run_dir / CHECKPOINTS_DIR / f"step-{CUT}")
    assert reference is not None and reference.endswith(f":step-{CUT}")
    frozen = storage.PoolSnapshot.parse(reference).frozen  # the workspace ("0") and HOME ("1") at K
    session = json.loads((frozen / "1" / ".urllib-session" / "messages.json").read_text())
    assert sum(message["role"] == "assistant" for message in session) == CUT  # not the final six
    yield outcome.run_dir
    disk.remove(storage.PoolSnapshot.parse(reference).pool)


@pytest.mark.slow
async def test_children_start_from_the_pool_snapshot_of_step_k(tmp_path: Path, original: Path) -> None:
    a, b = (ledger_script(tmp_path, name, CUT, f"child {name}") for name in ("a", "b"))
    summary = await branch(
        original,
        at=CUT,
        models=[a, b],
        options=RolloutSettings(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2),
        output=tmp_path / "tree",
    )
    assert summary.via == "snapshot" and summary.note is not None and "pool snapshot" in summary.note
    assert [(c.status, c.reward) for c in summary.children] == [("ok", 1.0), ("ok", 1.0)], summary.children
    for spec, name in ((a, "a"), (b, "b")):
        child = Path(summary.parent) / f"{model_slug(spec)}__0"
        rows = (child / "verifier" / "environment_state.txt").read_text()
        assert rows.strip() == repr([(k, f"entry {k}") for k in range(CUT)] + [(CUT, f"child {name}")])
        config = json.loads((child / "config.json").read_text())
        assert (
            "from_snapshot" not in config["sandbox_config"] and config["branched_from"]["via"] == "snapshot"
        )


def test_a_pruned_pool_or_another_backend_falls_back_to_the_layers(tmp_path: Path) -> None:
    assert kept_pool(tmp_path, "local") == (None, None)  # no pool recorded
    (tmp_path / "pool.json").write_text(json.dumps({"from_snapshot": f"{tmp_path}/gone:step-3"}))
    pool, note = kept_pool(tmp_path, "local")
    assert pool is None and note is not None and "is gone" in note
    pool, note = kept_pool(tmp_path, "docker")
    assert pool is None and note is not None and "needs the local sandbox" in note


@pytest.fixture(scope="module")
def every_step(tmp_path_factory: pytest.TempPathFactory, session_agent: str) -> Path:
    """A six-step run of the ledger task on local recorded by ``reroll run --checkpoint-keep 4`` (a
    process of its own: no helper process of the rollout outlives it in this one); its pool
    removed at the session's end."""
    folder = tmp_path_factory.mktemp("every-step")
    done = subprocess.run(
        [
            *(REROLL, "run", str(LEDGER), "--agent", session_agent, "--sandbox", "local"),
            *("--model", ledger_script(folder, "original", 6), "--checkpoint-keep", "4"),
            *("--jobs-dir", str(folder / "jobs"), "--job-name", "every-step"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = [path for path in (folder / "jobs" / "every-step").iterdir() if path.is_dir()]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok", done.stdout
    return run_dir


def test_a_recording_keeps_a_pool_checkpoint_at_every_step_as_its_retention_says(every_step: Path) -> None:
    kept = sorted(int(step.name[5:]) for step in (every_step / CHECKPOINTS_DIR).iterdir())
    assert kept == sorted(retained(range(1, 7), 4)) == [2, 4, 5, 6]
    for step in kept:
        layers = load_checkpoint(every_step / CHECKPOINTS_DIR / f"step-{step}", step=step)
        assert layers.expected == []  # the workspace, session and / (the ledger) are the pool's
        reference = pool_reference(every_step / CHECKPOINTS_DIR / f"step-{step}")
        assert reference is not None and storage.PoolSnapshot.parse(reference).name == f"step-{step}"
    assert reference is not None
    frozen = storage.PoolSnapshot.parse(reference).frozen.parent
    assert sorted(path.name for path in frozen.iterdir()) == [f"step-{step}" for step in kept]
    holds = json.loads((harness_folder(every_step) / HELD_FILE).read_text())
    assert holds["steps"] and holds["seconds"] == holds["capture"]  # the proxy froze: no round trip


@pytest.mark.slow
async def test_a_run_recorded_with_no_flag_branches_from_its_step_k(
    tmp_path: Path, session_agent: str
) -> None:
    recording = run_task(
        LEDGER,
        agent_name=session_agent,
        model=ledger_script(tmp_path, "original", 4),
        options=RolloutSettings(sandbox="local"),
        jobs_dir=tmp_path / "jobs",
    )
    outcome = await recording
    assert outcome.result.status == "ok", outcome.result.error
    kept = sorted(int(step.name[5:]) for step in (outcome.run_dir / CHECKPOINTS_DIR).iterdir())
    assert kept == [1, 2, 3, 4]
    spec = ledger_script(tmp_path, "a", 2, "child a")
    summary = await branch(
        outcome.run_dir,
        at=2,
        models=[spec],
        options=RolloutSettings(timeout_seconds=120),
        output=tmp_path / "tree",
    )
    assert (summary.via, summary.snapshot_step) == ("snapshot", 2), summary.note
    assert [(c.status, c.reward) for c in summary.children] == [("ok", 1.0)], summary.children
    rows = (
        Path(summary.parent) / f"{model_slug(spec)}__0" / "verifier" / "environment_state.txt"
    ).read_text()
    assert rows.strip() == repr([(k, f"entry {k}") for k in range(2)] + [(2, "child a")])


@pytest.mark.slow
async def test_a_branch_between_kept_steps_starts_from_the_nearest_earlier_and_replays(
    tmp_path: Path, every_step: Path
) -> None:
    spec = ledger_script(tmp_path, "a", 3, "child a")
    summary = await branch(
        every_step,
        at=3,
        models=[spec],
        options=RolloutSettings(timeout_seconds=120),
        output=tmp_path / "tree",
    )
    assert (summary.via, summary.snapshot_step) == ("snapshot", 2), summary.note
    assert summary.note is not None and "replaying steps 2..3" in summary.note
    assert [(c.status, c.reward) for c in summary.children] == [("ok", 1.0)], summary.children
    child = Path(summary.parent) / f"{model_slug(spec)}__0"
    rows = (child / "verifier" / "environment_state.txt").read_text()
    assert rows.strip() == repr([(k, f"entry {k}") for k in range(3)] + [(3, "child a")])
