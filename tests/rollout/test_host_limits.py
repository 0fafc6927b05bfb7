"""A task asking for more CPUs or memory than the host has runs capped to what the host has, with
a note on the console and in the run folder's ``limits.txt`` (never Docker's raw ``Range of CPUs``
error); a backend that enforces no limits (``local-plain``) gets the task as it is."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
from reroll.rollout import lifecycle
from reroll.runfolder.run import LIMITS_FILE
from reroll.tasks.task import Task, load_task
from reroll.tasks.variants import capped_to_host
from rich.console import Console


def _task(tmp_path: Path, cpus: float, memory_mb: int) -> Task:
    root = tmp_path / "big"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test.sh").write_text("#!/bin/sh\n")
    (root / "instruction.md").write_text("Nothing.\n")
    (root / "task.toml").write_text(
        f'version = "1.0"\n[environment]\ncpus = {cpus}\nmemory = "{memory_mb}M"\n'
    )
    return load_task(root)


def test_limits_above_the_hosts_are_capped_each_with_a_note(tmp_path: Path) -> None:
    task = _task(tmp_path, cpus=8, memory_mb=65536)
    capped, notes = capped_to_host(task, host_cpus=2, host_memory_mb=24000)
    assert (capped.spec.environment.cpus, capped.spec.environment.memory_mb) == (2, 24000)
    assert notes == [
        "task big asks for environment.cpus = 8 but this host has 2: the sandbox runs with cpus = 2",
        "task big asks for environment.memory_mb = 65536 but this host has 24000 MiB: "
        "the sandbox runs with memory_mb = 24000",
    ]
    assert task.spec.environment.cpus == 8  # the loaded task is left as it is


def test_limits_within_the_hosts_are_kept_without_a_note(tmp_path: Path) -> None:
    task = _task(tmp_path, cpus=1.5, memory_mb=2048)
    assert capped_to_host(task, host_cpus=2, host_memory_mb=2048) == (task, [])
    capped, notes = capped_to_host(task, host_cpus=1, host_memory_mb=4096)
    assert capped.spec.environment.cpus == 1 and capped.spec.environment.memory_mb == 2048
    assert len(notes) == 1 and "cpus = 1.5" in notes[0]


@pytest.mark.parametrize("backend", ["docker", "local", "local-plain"])
def test_the_note_goes_to_the_console_and_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setattr(lifecycle, "host_cpus", lambda: 2)
    monkeypatch.setattr(lifecycle, "host_memory_mb", lambda: 1 << 20)
    task = _task(tmp_path, cpus=4, memory_mb=4096)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan = SimpleNamespace(task=task, run_dir=run_dir, config=SimpleNamespace(sandbox=backend))
    out = io.StringIO()
    given = lifecycle._fit_to_host(plan, Console(file=out, width=200))  # type: ignore[arg-type]
    if backend == "local-plain":  # enforces no limits: nothing to cap, nothing to say
        assert given is task and out.getvalue() == "" and not (run_dir / LIMITS_FILE).exists()
        return
    note = "task big asks for environment.cpus = 4 but this host has 2: the sandbox runs with cpus = 2"
    assert given.spec.environment.cpus == 2
    assert note in out.getvalue()
    assert (run_dir / LIMITS_FILE).read_text() == note + "\n"
