"""A task's setup commands (`reroll.environment.setup`) in a real rollout on the `local` sandbox:
they run in order before the agent, with their own env (host templates resolved) and folder, and
their output is logged; one that fails ends the rollout as ``environment_error`` before the agent
starts, naming it; ``host_lock`` serialises commands of one name."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.environment import setup
from reroll.tasks.environment import SetupCommand

from tests.environment.test_services import oracle_run


def setup_task(folder: Path, commands: list[dict[str, Any]]) -> Path:
    """A native task whose oracle passes when the setup commands seeded the workspace."""
    front = {"name": "with-setup", "environment": {"setup_commands": commands}}
    (folder / "verifier").mkdir(parents=True)
    (folder / "oracle").mkdir()
    (folder / "environment" / "workspace").mkdir(parents=True)
    (folder / "task.md").write_text(f"---\n{yaml.safe_dump(front)}---\nRead the seed.\n")
    (folder / "oracle" / "solve.sh").write_text("echo $(cat seeded/first seeded/second) > answer.txt\n")
    (folder / "verifier" / "test.sh").write_text(
        'if [ "$(cat "$REROLL_WORKSPACE/answer.txt")" = "one two" ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    return folder


@pytest.mark.spawns
def test_setup_commands_seed_the_workspace_before_the_agent(tmp_path: Path) -> None:
    commands: list[dict[str, Any]] = [
        {"command": "mkdir -p seeded && echo one > seeded/first"},
        {"command": 'echo "$WORD" > second', "cwd": "/tmp", "env": {"WORD": "${REROLL_UNSET_WORD:-two}"}},
        {"command": "mv /tmp/second seeded/second", "host_lock": "seed"},
    ]
    result, run = oracle_run(setup_task(tmp_path / "task", commands), tmp_path / "jobs")
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}
    log = (run / "services" / "setup.log").read_text()
    assert "# [0] mkdir -p seeded && echo one > seeded/first → exit 0" in log
    assert "# [2] mv /tmp/second seeded/second → exit 0" in log


@pytest.mark.spawns
def test_a_failing_setup_command_ends_the_rollout_before_the_agent(tmp_path: Path) -> None:
    commands = [{"command": "echo seeding; echo no database >&2; exit 3"}]
    result, run = oracle_run(setup_task(tmp_path / "task", commands), tmp_path / "jobs")
    assert (result["status"], result["error_category"]) == ("error", "environment_error")
    assert (
        "environment.setup_commands[0] `echo seeding; echo no database >&2; exit 3` exited 3"
        in result["error"]
    )
    assert "no database" in result["error"]
    assert not (run / "agent" / "output.log").exists()  # the agent never started


def test_a_setup_command_runs_in_the_sandbox_only() -> None:
    with pytest.raises(ValueError, match="runs setup commands in the sandbox"):
        SetupCommand(command="true", service="db")


async def test_holders_of_one_host_lock_never_overlap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``host_lock``: a file lock under reroll's cache, held one at a time (also within one
    process: one job runs many rollouts), waited for without blocking the event loop."""
    monkeypatch.setenv("REROLL_CACHE_DIR", str(tmp_path / "cache"))
    spans: list[tuple[float, float]] = []

    async def hold(name: str) -> None:
        async with setup._host_lock(name):
            began = time.monotonic()
            await asyncio.sleep(0.2)
            spans.append((began, time.monotonic()))

    await asyncio.gather(*(hold("shared db") for _ in range(3)))
    assert len(spans) == 3
    assert all(earlier[1] <= later[0] for earlier, later in itertools.pairwise(sorted(spans)))
    assert (tmp_path / "cache" / "setup-locks" / "shared_db.lock").exists()
    spans.clear()
    await asyncio.gather(hold("a"), hold("b"))  # two names: held at once
    (first, second) = sorted(spans)
    assert second[0] < first[1]
