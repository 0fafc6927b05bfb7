"""Multi-turn end to end: Claude Code and Codex (from PyPI, unmodified) told two prompts in one session
(`examples/trials/multi-turn.yaml`, its `resume` command: ``claude --continue``), in the local
sandbox; then continued from the start of the resumed turn (``--at 1:0``): turn 0 replayed, the
resumed turn live in the session the replay rebuilt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_main_job import read_json, reroll, trajectory

TRIALS = Path(__file__).resolve().parents[2] / "examples" / "trials"
pytestmark = [pytest.mark.slow, pytest.mark.spawns]


def test_a_resumed_turn_continues_the_session_and_continues_from_it(tmp_path: Path) -> None:
    done = reroll("run", "--trial", str(TRIALS / "multi-turn.yaml"), "--timeout", "120",
                  "--jobs-dir", "jobs", "--job-name", "mt", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = [path for path in (tmp_path / "jobs" / "mt").iterdir() if path.is_dir()]
    assert read_json(run / "result.json")["rewards"] == {"reward": 1.0}
    assert "bye.txt" in read_json(run / "workspace_manifest.json")
    lines = trajectory(run)
    assert [line["metadata"]["place"]["turn"] for line in lines] == [0, 0, 1, 1]
    assert {line["metadata"]["thread"] for line in lines} == {0}  # one conversation
    first, resumed = lines[1]["request"]["body"]["messages"], lines[2]["request"]["body"]["messages"]
    # the resumed turn's requests extend the first session (cache_control markers move along)
    assert [m["role"] for m in resumed[: len(first)]] == [m["role"] for m in first]
    assert resumed[2] == first[2] and "toolu_0_0" in json.dumps(resumed[3])
    assert read_json(run / "trial.json")["turns"][1]["resume"] is True

    done = reroll("continue", str(run), "--at", "1:0", "--timeout", "120", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (continued,) = [path for path in (run.parent / "continued").iterdir() if path.is_dir()]
    assert read_json(continued / "result.json")["rewards"] == {"reward": 1.0}
    sources = [line["metadata"]["source"] for line in trajectory(continued)]
    assert sources == ["replayed", "replayed", "live", "live"]


CODEX_SCRIPT = """
turns:
  - content: "I'll create the file."
    tool_calls:
      - name: exec_command
        arguments: {cmd: "echo 'Hello, reroll!' > hello.txt && cat hello.txt"}
  - content: "Done: hello.txt holds the line."
  - content: "Writing bye.txt too."
    tool_calls:
      - name: exec_command
        arguments: {cmd: "echo 'Bye.' > bye.txt && cat bye.txt"}
  - content: "Done: bye.txt written."
"""


def test_codex_resumes_its_last_session(tmp_path: Path) -> None:
    """Codex's `resume` (``codex exec resume --last``): the second prompt's requests carry the
    first's input."""
    (tmp_path / "codex.script.yaml").write_text(CODEX_SCRIPT)
    trial = yaml.safe_load((TRIALS / "multi-turn.yaml").read_text())
    trial["task"] = str(TRIALS.parent / "tasks" / "hello-file")
    trial["scenes"][0]["roles"][0] |= {"agent": "codex", "model": "scripted:codex.script.yaml"}
    (tmp_path / "trial.yaml").write_text(yaml.safe_dump(trial))
    done = reroll("run", "--trial", "trial.yaml", "--timeout", "120", "--jobs-dir", "jobs",
                  "--job-name", "cx", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run,) = [path for path in (tmp_path / "jobs" / "cx").iterdir() if path.is_dir()]
    assert read_json(run / "result.json")["rewards"] == {"reward": 1.0}
    assert "bye.txt" in read_json(run / "workspace_manifest.json")
    lines = trajectory(run)
    assert [line["metadata"]["place"]["turn"] for line in lines] == [0, 0, 1, 1]
    assert {line["metadata"]["thread"] for line in lines} == {0}
    first, resumed = lines[1]["request"]["body"]["input"], lines[2]["request"]["body"]["input"]
    assert len(resumed) > len(first) and "call_0_0" in json.dumps(resumed)
