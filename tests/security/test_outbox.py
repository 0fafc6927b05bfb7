"""Red team: the outbox (`reroll.rollout.turns.scenes.read_outbox`) is agent-written. A role plants a
symlink to a root-only file as its peer's message and a FIFO as its own: the peer's prompt gets nothing of
the file, the FIFO blocks nothing, and a plain message still arrives — in docker, where the
agent is an unprivileged user and reroll's side is root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import labelled_containers

pytestmark = [pytest.mark.slow, pytest.mark.spawns]
REROLL = str(Path(sys.executable).parent / "reroll")
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "hello-file"

AGENTS = """
planter:
  description: plants hostile outbox files
  api_format: none
  launch: >-
    mkdir -p .outbox && ln -s /etc/shadow .outbox/peer.json && mkfifo .outbox/planter.json &&
    printf '%s' '{"to": "third", "content": "plain message"}' > .outbox/third.json
idle:
  description: does nothing
  api_format: none
  launch: "true"
"""

TRIAL = f"""
task: {TASK}
scenes:
  - name: attack
    roles: [{{name: planter, agent: planter}}, {{name: peer, agent: idle}}, {{name: third, agent: idle}}]
    turns:
      - {{role: planter, prompt: plant}}
      - {{role: peer, prompt: read}}
      - {{role: third, prompt: read}}
      - {{role: planter, prompt: again}}
"""


@pytest.mark.usefixtures("docker_images")
def test_outbox_symlinks_and_fifos_leak_and_block_nothing(tmp_path: Path) -> None:
    (tmp_path / "agents.yaml").write_text(AGENTS)
    (tmp_path / "trial.yaml").write_text(TRIAL)
    env = {**os.environ, "REROLL_AGENTS_FILE": str(tmp_path / "agents.yaml")}
    done = subprocess.run(
        [REROLL, "run", "--trial", "trial.yaml", "--sandbox", "docker", "--jobs-dir", "jobs",
         "--job-name", "o"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    (run,) = [path for path in (tmp_path / "jobs" / "o").iterdir() if path.is_dir()]
    assert json.loads((run / "result.json").read_text())["status"] == "ok"
    prompts = json.loads((run / "prompts.json").read_text())
    assert prompts[:2] == ["plant", "read"]  # neither the shadow file nor a hang
    assert prompts[2] == "read\n\nMessages for you from the other roles:\n- From planter: plain message"
    assert prompts[3] == "again"  # the FIFO was no message
    assert not labelled_containers(run.name)
