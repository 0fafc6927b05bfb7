"""The exporter registry (`reroll.export.formats`): every format by name, an unknown one refused."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from reroll.export import export_lines
from reroll.export.formats import EXPORTERS, exporter
from reroll_contracts.errors import ExportError

from tests.export.conftest import chat_exchanges, write_run


def test_every_format_is_registered_under_its_name_with_a_docstring() -> None:
    assert sorted(EXPORTERS) == ["atif", "verifiers"]
    for name, registered in EXPORTERS.items():
        assert registered.name == name and registered.summary
        assert type(registered).__doc__


def test_an_unknown_format_is_refused_before_the_path_is_read(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"unknown export format 'nope'; known: atif, verifiers"):
        exporter("nope")
    with pytest.raises(ExportError, match="unknown export format"):  # not "not a run folder"
        list(export_lines(tmp_path / "missing", "nope"))


@pytest.mark.parametrize("name", sorted(EXPORTERS))
def test_each_exporter_encodes_a_run_as_json_ending_in_a_newline(tmp_path: Path, name: str) -> None:
    run = write_run(tmp_path / "run", chat_exchanges())
    (piece,) = list(export_lines(run, name))
    assert piece.endswith(b"\n") and isinstance(orjson.loads(piece), dict)
