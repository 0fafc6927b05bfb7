"""Loading run folders: reroll's, BenchFlow's, and damaged ones."""

from __future__ import annotations

import ast
import json
from pathlib import Path, PurePath
from typing import Any

import pytest
from reroll.runfolder import asks, folders, run, store, summary, trial
from reroll.runfolder.run import RunResult, create_run_folder, harness_part, load_run_folder
from reroll_contracts.errors import RunFolderError

CONTROLLER = Path(__file__).resolve().parents[2] / "controller" / "reroll"


def exchange_line(step: int) -> str:
    """One BenchFlow-shaped exchange line (what BenchFlow writes: no reroll metadata)."""
    return json.dumps(
        {
            "request": {
                "timestamp": "2026-01-01T00:00:00Z",
                "method": "POST",
                "path": "/v1/chat/completions",
                "headers": {"content-type": "application/json"},
                "body": {"model": "m", "messages": [{"role": "user", "content": f"step {step}"}]},
            },
            "response": {
                "timestamp": "2026-01-01T00:00:01Z",
                "status_code": 200,
                "headers": {},
                "body": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
            },
            "duration_ms": 12.5,
            "metadata": {},
        }
    )


def make_run_folder(path: Path, lines: list[str], *, result: dict[str, Any] | None = None) -> Path:
    (path / "trajectory").mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"task_path": "/tasks/t", "agent": "openhands", "model": "m"})
    )
    (path / "prompts.json").write_text(json.dumps(["do it"]))
    if result is not None:
        (path / "result.json").write_text(json.dumps(result))
    (path / "trajectory" / "llm_trajectory.jsonl").write_text("".join(line + "\n" for line in lines))
    return path


def test_benchflow_folder_loads_and_timeout_status_is_derived(tmp_path: Path) -> None:
    folder = make_run_folder(
        tmp_path / "run",
        [exchange_line(0), exchange_line(1)],
        result={"rewards": None, "error_category": "timeout"},
    )
    run = load_run_folder(folder)
    assert len(run.exchanges) == 2
    assert run.result is not None and run.result.effective_status == "timeout"
    assert run.prompts == ["do it"]


def test_truncated_last_line_is_reported_and_ignored(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    trajectory = folder / "trajectory" / "llm_trajectory.jsonl"
    with trajectory.open("a") as out:
        out.write(exchange_line(1)[:57])  # killed mid-write: no newline, half a JSON object
    run = load_run_folder(folder)
    assert len(run.exchanges) == 1
    assert run.trajectory.truncated_line == 2
    assert run.trajectory.warning


def test_corrupt_middle_line_names_file_and_line(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0), "{not json", exchange_line(2)])
    with pytest.raises(RunFolderError, match=r"llm_trajectory\.jsonl.*line 2|line 2.*llm_trajectory\.jsonl"):
        load_run_folder(folder)


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    (folder / "config.json").unlink()
    with pytest.raises(RunFolderError, match=r"config\.json: missing"):
        load_run_folder(folder)


def test_invalid_config_names_the_file(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    (folder / "config.json").write_text('{"agent": 3}')
    with pytest.raises(RunFolderError, match=r"config\.json: invalid content"):
        load_run_folder(folder)


def test_missing_result_is_tolerated(tmp_path: Path) -> None:
    run = load_run_folder(make_run_folder(tmp_path / "run", [exchange_line(0)]))
    assert run.result is None


def test_result_status_wins_over_category() -> None:
    assert RunResult(status="ok", error_category="timeout").effective_status == "ok"
    assert RunResult(error="boom").effective_status == "error"


def test_a_null_status_reads_as_unknown_never_ok(tmp_path: Path) -> None:
    """reroll writes ``status: null`` only for a rollout interrupted before it ended; BenchFlow's
    files have no ``status`` key, and theirs is still derived."""
    interrupted = make_run_folder(
        tmp_path / "run", [exchange_line(0)], result={"status": None, "error": None}
    )
    run = load_run_folder(interrupted)
    assert run.result is not None and run.result.effective_status == "unknown"
    assert RunResult.model_validate({"error": None}).effective_status == "ok"


def test_create_run_folder_never_reuses_a_name(tmp_path: Path) -> None:
    first = create_run_folder(tmp_path, "r")
    second = create_run_folder(tmp_path, "r")
    assert (first.name, second.name) == ("r", "r-2")
    assert (second / "trajectory").is_dir()


def test_a_run_folder_that_is_a_symlink_loop_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "run").symlink_to(tmp_path / "run")
    with pytest.raises(RunFolderError, match=f"run folder {tmp_path / 'run'}: cannot be resolved"):
        load_run_folder(tmp_path / "run")


def test_a_config_that_is_a_link_to_a_device_is_refused_unread(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "run", [exchange_line(0)])
    (folder / "config.json").unlink()
    (folder / "config.json").symlink_to("/dev/zero")
    with pytest.raises(RunFolderError, match=f"{folder / 'config.json'}: a symlink"):
        load_run_folder(folder)


def test_side_trajectories_load_only_when_asked_so_a_corrupt_judge_file_never_stops_a_rerun(
    tmp_path: Path,
) -> None:
    run = make_run_folder(tmp_path / "run", [exchange_line(0)])
    (run / "trajectory" / "user_trajectory.jsonl").write_text(exchange_line(0) + "\n")
    (run / "trajectory" / "judge_trajectory.jsonl").write_text("{not json\n" + exchange_line(0) + "\n")
    assert load_run_folder(run).sides == {}  # continue, replay, rescore: the agent's recording only
    with pytest.raises(RunFolderError, match=r"judge_trajectory\.jsonl.*line 1"):
        load_run_folder(run, sides=True)  # view, export
    (run / "trajectory" / "judge_trajectory.jsonl").unlink()
    assert [len(side.exchanges) for side in load_run_folder(run, sides=True).sides.values()] == [1]


def test_a_harness_part_lies_in_the_private_harness_folder(tmp_path: Path) -> None:
    part = harness_part(tmp_path, "persona")
    assert part == tmp_path / "harness" / "persona" and not part.exists()
    assert (tmp_path / "harness").stat().st_mode & 0o777 == 0o700


GENERIC_NAMES = {"verifier", "agent", "skills", "memory", "store", "objects", "generations"}
"""Names of the run-folder tree that are also folders of a task or of a sandbox's own state
(``task/verifier``, a sandbox's ``verifier/``): a literal of these says nothing."""


def literal_run_folder_paths(source: str, names: set[str]) -> list[str]:
    """Where `source` joins a run-folder name as a string literal (``x / "result.json"``), or any
    string literal onto `harness_folder(...)` (`harness_part` names those): ``line: literal``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
            continue
        right, left = node.right, node.left
        if not (isinstance(right, ast.Constant) and isinstance(right.value, str)):
            continue
        if isinstance(left, ast.Call) and getattr(left.func, "id", None) == "harness_folder":
            found.append(f"{node.lineno}: harness_folder(...) / {right.value}")
        elif PurePath(right.value).parts[:1] and PurePath(right.value).parts[0] in names:
            found.append(f"{node.lineno}: {right.value}")
    return found


def run_folder_names() -> set[str]:
    """The first part of every name the runfolder package declares (its upper-case constants)."""
    names: set[str] = set()
    for module in (run, folders, summary, store, asks, trial):
        for key, value in vars(module).items():
            if key.isupper() and isinstance(value, str | PurePath) and str(value):
                names.add(PurePath(value).parts[0])
    return names


def test_no_module_outside_the_runfolder_package_spells_a_run_folder_path() -> None:
    names = run_folder_names() - GENERIC_NAMES
    assert {"result.json", "trajectory", "harness", "config.json"} <= names
    offenders = [
        f"{file.relative_to(CONTROLLER.parent.parent)}:{where}"
        for file in sorted(CONTROLLER.rglob("*.py"))
        if "runfolder" not in file.relative_to(CONTROLLER).parts
        for where in literal_run_folder_paths(file.read_text(), names)
    ]
    assert offenders == []


def test_a_spelt_run_folder_path_is_found() -> None:
    source = 'a = run_dir / "result.json"\nb = harness_folder(run_dir) / "judge"\nc = task / "verifier"\n'
    assert literal_run_folder_paths(source, {"result.json"}) == [
        "1: result.json",
        "2: harness_folder(...) / judge",
    ]
