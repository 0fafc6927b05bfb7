"""The example tasks of both benchmark layouts, each run by the `oracle` agent to reward 1.0 with
the real `reroll run`, once per sandbox backend (docker builds each task's image once; the second
run of the module reuses it; the local sandbox runs on the image of each but ``fix-failing-test``,
whose Dockerfile its host view makes):

- ``fix-failing-test``: reroll's own layout; its reward comes from the hidden tests' JUnit report
  (pytest in the docker image, its unittest runner where the host has no pytest);
- ``harbor-ctrf``: Terminal-Bench / Harbor legacy layout, root in /app, pytest with the CTRF plugin
  installed in its image, the reward from the CTRF report;
- ``skillsbench-yaml``: SkillsBench-style task.toml, workdir /root, PyYAML installed in its image;
- ``native-verifier``: benchflow's native task.md (``sandbox:``, ``## prompt``, ``verifier/``),
  whose environment variable reaches the oracle and the verifier; FROM ``debian:trixie-slim``
  (the catalogue's trixie, no Python), and once more on a busybox-only image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from reroll.rollout.sandbox_spec import sandbox_spec
from reroll.sandbox.local import imagebuild, imagefs
from reroll.tasks.task import load_task

REROLL = str(Path(sys.executable).parent / "reroll")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
pytestmark = pytest.mark.slow


def oracle_run(task: Path, sandbox_backend: str, tmp_path: Path, *flags: str) -> str:
    """`reroll run TASK --agent oracle [flags]` ends ok with reward 1.0; returns what it printed."""
    args = ["run", str(task), "--agent", "oracle", "--sandbox", sandbox_backend, "--jobs-dir", str(tmp_path)]
    args += flags
    done = subprocess.run(
        [REROLL, *args, "--job-name", "j"],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    print(done.stdout, done.stderr, sep="\n")
    assert done.returncode == 0
    (run,) = (tmp_path / "j").iterdir()
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result.get("error")
    assert result["rewards"] == {"reward": 1.0}, (run / "verifier" / "test-stderr.txt").read_text()[-2000:]
    return done.stdout


EXAMPLE_TASKS = ["fix-failing-test", "harbor-ctrf", "skillsbench-yaml", "native-verifier"]


@pytest.mark.parametrize("example", EXAMPLE_TASKS)
def test_oracle_reaches_reward_one(example: str, sandbox_backend: str, tmp_path: Path) -> None:
    # local runs harbor-ctrf, skillsbench-yaml and native-verifier on their images (built with
    # Docker or buildah; pytest and its CTRF plugin come from harbor-ctrf's image, under network none).
    task = EXAMPLES / example
    needs_image = sandbox_backend == "local" and imagefs.spec_unhonoured(sandbox_spec(load_task(task)))
    if needs_image and (reason := imagebuild.no_builder()):
        pytest.skip(f"{example} needs its image on local, and {reason}")
    output = oracle_run(task, sandbox_backend, tmp_path)
    if example == "skillsbench-yaml":  # its skills_dir is honoured (informational), nothing ignored
        assert "ignores" not in output


def test_native_example_runs_on_a_busybox_only_image(variant_images: dict[str, str], tmp_path: Path) -> None:
    """``native-verifier`` (FROM debian:trixie-slim, so the catalogue's trixie without Python in
    the test above) mapped onto an image holding nothing but a static busybox."""
    mapping = f"debian:trixie-slim={variant_images['busybox']}"
    oracle_run(EXAMPLES / "native-verifier", "docker", tmp_path, "--image-map", mapping)
