"""The example tasks of both benchmark layouts, each run by the `oracle` agent to reward 1.0 with
the real `reroll run`, once per sandbox backend (docker builds each task's image once; the second
run of the module reuses it):

- ``harbor-ctrf``: Terminal-Bench / Harbor legacy layout, root in /app, pytest with the CTRF plugin
  installed in its image;
- ``skillsbench-yaml``: SkillsBench-style task.toml, workdir /root, PyYAML installed in its image;
- ``native-verifier``: benchflow's native task.md (``sandbox:``, ``## prompt``, ``verifier/``),
  whose environment variable reaches the oracle and the verifier.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REROLL = str(Path(sys.executable).parent / "reroll")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tasks"
pytestmark = pytest.mark.slow

PLUGINS_BLOCKED = {
    "docker": pytest.mark.xfail(
        reason="verifier hardening (PYTEST_DISABLE_PLUGIN_AUTOLOAD) blocks the root-owned ctrf plugin of the "
        "image, so `pytest --ctrf` is refused; issue 11 item 3 (the plugins branch) lets such plugins load",
        strict=True,
    ),
    "local": pytest.mark.xfail(
        reason="the local sandbox has no image: test.sh installs pytest-json-ctrf into a throwaway venv at "
        "verify time, and hardening blocks a plugin that was not there before the agent ran",
        strict=False,
    ),
}
"""Why ``harbor-ctrf`` scores 0 for now, per backend (its ``pytest --ctrf`` needs the plugin)."""


def oracle_run(task: Path, sandbox_backend: str, tmp_path: Path) -> str:
    """`reroll run TASK --agent oracle` ends ok with reward 1.0; returns what it printed."""
    args = ["run", str(task), "--agent", "oracle", "--sandbox", sandbox_backend, "--jobs-dir", str(tmp_path)]
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


@pytest.mark.parametrize("example", ["harbor-ctrf", "skillsbench-yaml", "native-verifier"])
def test_oracle_reaches_reward_one(
    example: str, sandbox_backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if example == "harbor-ctrf":
        request.applymarker(PLUGINS_BLOCKED[sandbox_backend])
    output = oracle_run(EXAMPLES / example, sandbox_backend, tmp_path)
    if example == "skillsbench-yaml":  # reported once, by name
        assert output.count("ignores environment.storage_mb") == 1


def test_declared_pytest_plugin_loads(sandbox_backend: str, tmp_path: Path) -> None:
    """benchflow's ``verifier.pytest_plugins`` (mapped onto reroll's hardening option) lets the
    image's ctrf plugin load (``-p ctrf``), so the Harbor example's ``pytest --ctrf`` runs."""
    task = tmp_path / "harbor-ctrf"  # the same folder name: the same image
    shutil.copytree(EXAMPLES / "harbor-ctrf", task)
    config = (task / "task.toml").read_text()
    (task / "task.toml").write_text(config.replace("[verifier]\n", '[verifier]\npytest_plugins = ["ctrf"]\n'))
    oracle_run(task, sandbox_backend, tmp_path / "jobs")
