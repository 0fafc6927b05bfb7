"""``reroll continue`` of a run folder written by BenchFlow (``agent: openhands``, a Gemini model,
no reroll metadata), with ``--agent`` naming the agent that continues it: a real rollout in the
`local` sandbox (the oracle agent: no model, a few seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_main_job import only_folder, read_json, reroll
from tests.rollout.test_checkpoint import benchflow_openhands_folder

pytestmark = pytest.mark.spawns


def test_continue_agent_overrides_the_recorded_openhands(tmp_path: Path, examples: Path) -> None:
    folder = benchflow_openhands_folder(tmp_path / "benchflow" / "hello__abc", examples / "hello-file", [])
    done = reroll("continue", str(folder), "--agent", "oracle", "--output", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    continued = only_folder(tmp_path / "out")
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    config = read_json(continued / "config.json")
    assert config["agent"] == "oracle" and config["continued_from"]["path"] == str(folder.resolve())
    assert config["continued_from"]["original_model"] == "gemini/gemini-3.1-flash-lite-preview"
    assert config["lineage_started_at"] == "2026-05-01T10:00:00+00:00"  # BenchFlow's started_at
