"""``reroll export``, in process: output to a file or standard output, exit 2 on bad input."""

from __future__ import annotations

from pathlib import Path

import orjson
from atif import Trajectory
from reroll.cli.app import app
from typer.testing import CliRunner

from tests.export.conftest import chat_exchanges, write_run


def test_export_writes_the_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    out = tmp_path / "out" / "run.atif.json"
    done = CliRunner().invoke(app, ["export", str(run), "--format", "atif", "--output", str(out)])
    assert done.exit_code == 0, done.output
    assert len(Trajectory.model_validate_json(out.read_bytes()).steps) == 5
    assert not list(out.parent.glob(".*.tmp"))


def test_export_prints_verifiers_lines_without_output(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    done = CliRunner().invoke(app, ["export", str(run), "--format", "verifiers"])
    assert done.exit_code == 0, done.output
    (line,) = done.stdout_bytes.splitlines()
    assert orjson.loads(line)["reward"] == 1.0


def test_a_corrupt_line_exits_2_naming_file_and_line_and_writes_nothing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    trajectory = run / "trajectory" / "llm_trajectory.jsonl"
    first, *rest = trajectory.read_bytes().splitlines(keepends=True)
    trajectory.write_bytes(first + b"{not json\n" + b"".join(rest))
    out = tmp_path / "out.jsonl"
    done = CliRunner().invoke(app, ["export", str(run), "--format", "verifiers", "--output", str(out)])
    assert done.exit_code == 2
    assert f"{trajectory}: line 2: invalid JSON" in " ".join(done.stderr.split())
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl.tmp"))


def test_an_unknown_format_exits_2_naming_the_known_ones_and_writes_nothing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    out = tmp_path / "out.jsonl"
    done = CliRunner().invoke(app, ["export", str(run), "--format", "nope", "--output", str(out)])
    assert done.exit_code == 2
    assert "unknown export format 'nope'; known: atif, verifiers" in " ".join(done.stderr.split())
    assert not out.exists()


def test_the_help_lists_every_registered_format() -> None:
    done = CliRunner().invoke(app, ["export", "--help"])
    assert done.exit_code == 0
    text = " ".join(done.output.split())
    assert "atif (Harbor's ATIF v1.8 trajectory)" in text and "verifiers (verifiers RolloutOutput" in text
