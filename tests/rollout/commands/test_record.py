"""``reroll run`` / `run_task`: a recording through the one rollout path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reroll.rollout.commands.record import run_task
from reroll.settings import RolloutSettings

pytestmark = pytest.mark.spawns  # a real rollout: sidecar and proxy processes


async def test_a_recording_writes_its_options_and_logs_into_the_run_folder(
    tmp_path: Path, examples: Path
) -> None:
    """Without a console, progress goes to harness/controller.log; the options land in config.json."""
    outcome = await run_task(
        examples / "hello-file",
        agent_name="oracle",
        options=RolloutSettings(timeout_seconds=50),
        jobs_dir=tmp_path,
        job_name="j",
        run_name="r",
    )
    assert outcome.run_dir == tmp_path / "j" / "r" and outcome.result.status == "ok"
    config = json.loads((outcome.run_dir / "config.json").read_text())
    assert (config["timeout_sec"], config["sandbox"], config["model"]) == (50, "local", None)
    log = (outcome.run_dir / "harness" / "controller.log").read_text()
    assert f"run folder: {outcome.run_dir}" in log and "running oracle (timeout 50 s)" in log


async def test_a_trial_files_skill_settings_apply_unless_given(tmp_path: Path) -> None:
    """A trial's ``skills`` is the recording's skill mode (`reroll.settings.recording_settings`);
    the given settings win over it."""
    from reroll.trials.config import Scene, TrialConfig

    task = Path(__file__).resolve().parents[1] / "skills_task"
    trial = TrialConfig(scenes=[Scene.single()], skills="with-skill")
    mounted = await run_task(task, agent_name="oracle", trial=trial, jobs_dir=tmp_path, job_name="j")
    config = json.loads((mounted.run_dir / "config.json").read_text())
    assert (config["skill_mode"], config["skill_source"]) == ("with-skill", "task_bundled")
    hidden = await run_task(
        task,
        agent_name="oracle",
        trial=trial,
        options=RolloutSettings(skill_mode="no-skill"),
        jobs_dir=tmp_path,
    )
    config = json.loads((hidden.run_dir / "config.json").read_text())
    assert (config["skill_mode"], config["skill_source"]) == ("no-skill", "none")
