"""``branch --via snapshot``: three layers (a SQLite database, the workspace, the agent's session)
captured during the run (``--checkpoint-every``) or by rebuilding the prefix once, forked into
children that start at step K with the parent's state and diverge (on local and docker); an agent
without a resumable session falls back to replay with a note. The docker runs take the machine's
docker lock: ``flock /tmp/reroll-docker-tests.lock .venv/bin/python -m pytest ...``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from reroll.agents import AGENTS_FILE_ENV, get_agent, registry
from reroll.jobs.branch import branch
from reroll.jobs.branch_layers import PREFIX_NAME, choose_via
from reroll.jobs.jobfile import RunnerOptions
from reroll.models.spec import model_slug
from reroll.rollout.commands.record import run_task
from reroll.rollout.process_layer import process_fork_refusal
from reroll.runfolder.run import CHECKPOINTS_DIR, TRAJECTORY
from reroll.sandbox.local.rootview import namespaces_unavailable
from reroll.settings import RolloutSettings

from tests.conftest import EXAMPLES

LEDGER = EXAMPLES / "sqlite-ledger"
SESSION_AGENTS = EXAMPLES.parent / "agents" / "urllib-session.yaml"
CUT = 3


def ledger_script(folder: Path, name: str, prefix: int, note: str | None = None) -> str:
    """A scripted model spec: the ledger task's first `prefix` steps, then (with `note`) one
    step that records ``(prefix, note)``, then done."""
    turns = yaml.safe_load((LEDGER / "scripted-model.yaml").read_text())["turns"]
    mine = turns[:prefix]
    if note is not None:
        step = json.loads(json.dumps(turns[prefix]))
        command = step["tool_calls"][0]["arguments"]["command"]
        step["tool_calls"][0]["arguments"]["command"] = command.replace(f"entry {prefix}", note)
        mine.append(step)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"turns": [*mine, turns[-1]]}))
    return f"scripted:{path.resolve()}"


@pytest.fixture(scope="module")
def session_agent() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(AGENTS_FILE_ENV, str(SESSION_AGENTS))
        registry.cache_clear()
        yield "urllib-session"
    registry.cache_clear()


def test_an_agent_without_a_resumable_session_falls_back_to_replay_with_a_note() -> None:
    aider = get_agent("aider")
    assert not aider.forkable and not aider.process_checkpoint
    via, note = choose_via(aider, "snapshot", None)
    assert via == "replay" and note is not None and "aider has no resumable session" in note
    assert choose_via(get_agent("claude-code"), None, "no CRIU here") == ("snapshot", None)
    assert choose_via(get_agent("claude-code"), "replay", None) == ("replay", None)


def test_an_agent_forked_by_its_process_takes_a_snapshot_where_criu_runs_when_asked() -> None:
    mini = get_agent("mini-swe-agent")
    assert mini.process_checkpoint and not mini.forkable
    via, note = choose_via(mini, "snapshot", None)
    assert via == "snapshot" and note is not None and "process tree" in note and "CRIU" in note
    refused = "a process checkpoint (CRIU) needs the isolated local sandbox, not docker"
    via, note = choose_via(mini, "snapshot", refused)
    assert via == "replay" and note is not None and refused in note
    via, note = choose_via(mini, None, None)  # by default it replays, saying how to fork it
    assert via == "replay" and note is not None and "--via snapshot" in note
    assert choose_via(mini, "replay", None) == ("replay", None)


def test_a_process_checkpoint_needs_the_isolated_local_sandbox() -> None:
    assert "not docker" in str(process_fork_refusal("docker"))
    assert "not local-plain" in str(process_fork_refusal("local-plain"))
    refusal = process_fork_refusal("local")
    assert (refusal is None) == (not namespaces_unavailable()), refusal


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory, session_agent: str, sandbox_backend: str) -> Path:
    """A six-step run of the ledger task on each sandbox backend, with a checkpoint recorded
    every `CUT` steps."""
    folder = tmp_path_factory.mktemp("original")
    recording = run_task(
        LEDGER,
        agent_name=session_agent,
        model=ledger_script(folder, "original", 6),
        options=RolloutSettings(sandbox=sandbox_backend, checkpoint_every=CUT),
        jobs_dir=folder / "jobs",
    )
    outcome = asyncio.run(recording)
    assert outcome.result.status == "ok", outcome.result.error
    return outcome.run_dir


@pytest.mark.slow
async def test_a_fork_gives_children_the_parents_state_at_k_that_then_diverge(
    tmp_path: Path, original: Path
) -> None:
    """From the checkpoint recorded during the run: no prefix re-executed at all."""
    assert sorted(p.name for p in (original / CHECKPOINTS_DIR).iterdir()) == [
        f"step-{CUT}",
        f"step-{2 * CUT}",
    ]
    a, b = (ledger_script(tmp_path, name, CUT, f"child {name}") for name in ("a", "b"))
    summary = await branch(
        original,
        at=CUT,
        models=[a, b],
        options=RolloutSettings(timeout_seconds=120),
        runner=RunnerOptions(concurrency=2),
        output=tmp_path / "tree",
    )
    parent = Path(summary.parent)
    assert summary.via == "snapshot" and summary.checkpoint == str(original / CHECKPOINTS_DIR / f"step-{CUT}")
    assert summary.note is not None and "recorded during the run" in summary.note
    assert not (parent / PREFIX_NAME).exists()
    assert summary.layers is not None and sorted(summary.layers) == ["environment", "sandbox", "session"]
    assert [(c.status, c.reward) for c in summary.children] == [("ok", 1.0), ("ok", 1.0)], summary.children
    assert all(child.restored == summary.layers for child in summary.children)
    for spec, name in ((a, "a"), (b, "b")):
        child = parent / f"{model_slug(spec)}__0"
        rows = (child / "verifier" / "environment_state.txt").read_text()
        expected = [(k, f"entry {k}") for k in range(CUT)] + [(CUT, f"child {name}")]
        assert rows.strip() == repr(expected)
        config = json.loads((child / "config.json").read_text())
        assert config["branched_from"]["via"] == "snapshot"
        assert len((child / TRAJECTORY).read_text().splitlines()) == 2  # live from K: its step, done


@pytest.mark.slow
async def test_without_a_recorded_checkpoint_the_prefix_is_rebuilt_once(
    tmp_path: Path, original: Path, sandbox_backend: str
) -> None:
    if sandbox_backend != "local":
        pytest.skip("the rebuild does not depend on the sandbox: checked once, on local")
    at = CUT - 1
    spec = ledger_script(tmp_path, "c", at, "child c")
    summary = await branch(original, at=at, models=[spec], options=RolloutSettings(timeout_seconds=120))
    parent = Path(summary.parent)
    assert (
        summary.checkpoint == str(parent / PREFIX_NAME / CHECKPOINTS_DIR / f"step-{at}")
        and (parent / PREFIX_NAME / "config.json").is_file()
    )
    assert [(c.status, c.reward) for c in summary.children] == [("ok", 1.0)], summary.children
    assert summary.children[0].restored == summary.layers
    rows = (parent / f"{model_slug(spec)}__0" / "verifier" / "environment_state.txt").read_text()
    assert rows.strip() == repr([(0, "entry 0"), (1, "entry 1"), (2, "child c")])
