"""Red team, issue 32: a shared run folder whose config.json names host code shipped inside it.

The folder names a trial User (``harness/user.py:attr``, the file inside the folder) and, in a
second variant, an out-of-tree sandbox backend module shipped beside it. `reroll continue`,
`reroll replay`, `reroll rescore` and `reroll branch` of it must import nothing it names: exit 2
naming the file and the ``--trust`` flag, the marker the code would write never written. Before
the fix, ``continue`` and ``replay`` imported the User as root on the host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_errors import reroll
from tests.runfolder.test_run import exchange_line, make_run_folder

pytestmark = pytest.mark.spawns

PAYLOAD = (
    "import pathlib\npathlib.Path({marker!r}).write_text('pwned')\n\ndef attr(*args):\n    return None\n"
)


def crafted_run(tmp_path: Path, examples: Path, *, sandbox: str = "local") -> tuple[Path, Path]:
    """A run folder whose config.json names `harness/user.py:attr` inside it; returns the folder
    and the marker file its code would write on import."""
    marker = tmp_path / "pwned"
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"error_category": "timeout"})
    (folder / "harness").mkdir()
    (folder / "harness" / "user.py").write_text(PAYLOAD.format(marker=str(marker)))
    (folder / "harness" / "evil_backend.py").write_text(PAYLOAD.format(marker=str(marker)))
    config = {
        "task_path": str(examples / "hello-file"),
        "agent": "mini-swe-agent",
        "model": "scripted",
        "sandbox": sandbox,
        "trial": {
            "scenes": [
                {"name": "s", "roles": [{"name": "a"}], "user": f"{folder / 'harness' / 'user.py'}:attr"}
            ]
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "workspace_manifest.json").write_text("{}")
    return folder, marker


@pytest.mark.parametrize("command", ["continue", "replay", "rescore", "branch", "continue-job"])
def test_a_run_folder_naming_a_user_runs_no_code_of_it(command: str, tmp_path: Path, examples: Path) -> None:
    folder, marker = crafted_run(tmp_path, examples)
    target = folder.parent if command == "continue-job" else folder  # a job: a folder of run folders
    args = [command, str(target)] + (["--at", "0", "--model", "scripted"] if command == "branch" else [])
    done = reroll(*args, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--trust" in done.stderr and "harness/user.py" in done.stderr, done.stderr
    assert not marker.exists(), "the run folder's code ran on the host"


def test_a_run_folder_naming_an_out_of_tree_backend_runs_no_code_of_it(
    tmp_path: Path, examples: Path
) -> None:
    folder, marker = crafted_run(tmp_path, examples, sandbox="evil_backend:Sandbox")
    (tmp_path / "evil_backend.py").write_text(PAYLOAD.format(marker=str(marker)))  # importable from cwd
    config = json.loads((folder / "config.json").read_text())
    config.pop("trial")
    (folder / "config.json").write_text(json.dumps(config))
    done = reroll("replay", str(folder), cwd=tmp_path)
    assert done.returncode == 2 and "--trust evil_backend" in done.stderr, done.stderr
    assert not marker.exists(), "the run folder's backend was imported on the host"


def test_trusting_the_user_again_lets_the_continuation_load_it(tmp_path: Path, examples: Path) -> None:
    folder, marker = crafted_run(tmp_path, examples)
    user_file = str(folder / "harness" / "user.py")
    done = reroll("replay", str(folder), "--trust", user_file, cwd=tmp_path)
    assert "--trust" not in done.stderr, done.stderr  # past the gate: the User was imported
    assert marker.exists()
