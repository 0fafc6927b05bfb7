"""Red team, issue 32: a shared run folder whose files lead out of it, block, or are huge.

A crafted folder's ``config.json`` is a symlink to a host file, its ``trajectory/`` a symlink to a
host folder, ``trial.json``/``asks.json``/``summary.json`` FIFOs nobody writes, its exchanges a
2 GiB sparse file. `reroll continue`, ``replay``, ``rescore``, ``branch``, ``view`` and ``export``
of it must refuse it with an error naming the file (and the cap, for the size), hang on nothing
(each run has a deadline) and read nothing outside the folder. Before the fix, the symlinks were
followed (the host file read as the run's config), ``view``/``export`` blocked on the FIFO
``summary.json``, ``continue`` on ``trial.json``, ``export`` on ``asks.json``, and the 2 GiB
trajectory was read whole into memory.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_errors import REROLL
from tests.runfolder.test_run import exchange_line, make_run_folder

pytestmark = pytest.mark.spawns

COMMANDS = {
    "continue": ["continue"],
    "replay": ["replay"],
    "rescore": ["rescore"],
    "branch": ["branch", "--at", "0", "--model", "scripted"],
    "view": ["view"],
    "export": ["export", "--format", "atif"],
}
FIFOS = ("summary.json", "trial.json", "asks.json")
SPARSE_BYTES = 2 * 1024**3
DEADLINE_SECONDS = 30


def honest_run(tmp_path: Path, examples: Path) -> Path:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)], result={"error_category": "timeout"})
    config = {"task_path": str(examples / "hello-file"), "agent": "oracle", "model": None, "sandbox": "local"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def attack(kind: str, folder: Path, outside: Path) -> str:
    """Make `folder` hostile as `kind`; returns the file the error must name."""
    outside.mkdir()
    if kind == "config-symlink":  # a host file that is a valid config: followed, the run goes on
        (folder / "config.json").rename(outside / "host.json")
        (folder / "config.json").symlink_to(outside / "host.json")
        return "config.json"
    if kind == "trajectory-folder-symlink":
        (folder / "trajectory").rename(outside / "trajectory")
        (folder / "trajectory").symlink_to(outside / "trajectory")
        return "llm_trajectory.jsonl"
    if kind == "exchanges-sparse":
        with open(folder / "trajectory" / "llm_trajectory.jsonl", "wb") as file:
            file.truncate(SPARSE_BYTES)
        return "llm_trajectory.jsonl"
    for name in FIFOS:  # each command reads one of them at least: it must refuse, not wait
        os.mkfifo(folder / name)
    return "|".join(FIFOS)


@pytest.mark.timeout(DEADLINE_SECONDS * 2)
@pytest.mark.parametrize(
    "kind",
    ["config-symlink", "trajectory-folder-symlink", "exchanges-sparse", "fifos"],
)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_crafted_run_folder_is_refused_without_following_blocking_or_reading_past_a_cap(
    command: str, kind: str, tmp_path: Path, examples: Path
) -> None:
    folder = honest_run(tmp_path, examples)
    named = attack(kind, folder, tmp_path / "host")
    args = [REROLL, *COMMANDS[command][:1], str(folder), *COMMANDS[command][1:]]
    if command == "view":
        args += ["--output", str(tmp_path / "site")]
    try:
        done = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=DEADLINE_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reroll {command} hung on a run folder with {kind}")
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert any(name in done.stderr for name in named.split("|")), done.stderr
    expected = {"fifos": "not a regular file", "symlink": "symlink", "sparse": "cap of 1 GiB"}
    assert expected[kind.rpartition("-")[2]] in done.stderr, done.stderr
