"""The export formats by name (`EXPORTERS`): what ``reroll export --format NAME`` can write.

An exporter turns one run folder (a `reroll.export.Source`: the run and what its job or branch
tree adds) into the bytes of one export piece. To add a format, write a class with `name`,
`summary` and `encode` (the `Exporter` protocol) and add an instance to `EXPORTERS`; the CLI's
``--format`` takes every key. Exporters import their format's modules when they first encode,
so ``reroll --help`` does not load them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import orjson
from reroll_contracts.errors import ExportError

if TYPE_CHECKING:
    from reroll.export import Source


class Exporter(Protocol):
    """One export format."""

    name: str
    """What ``--format`` calls it."""
    summary: str
    """One line for ``reroll export --help``."""

    def encode(self, source: Source, *, single: bool) -> bytes:
        """The export of `source` as the bytes to write, ending in a newline.

        Args:
            source: one run folder, with what its job or tree adds (`Source.extra`).
            single: the export is of this run alone (not of a job or tree): a format may then
                write one indented document instead of one line.

        Raises:
            ExportError: the run cannot be written in this format (the message names the run).
        """
        ...


class AtifExporter:
    """Harbor's ATIF v1.8 trajectory (`reroll.export.atif`): one indented JSON document for a lone
    run, else one trajectory per line; a job's or tree's entries (a branch's ``checkpoint``) go
    into ``extra.reroll``."""

    name = "atif"
    summary = "Harbor's ATIF v1.8 trajectory"

    def encode(self, source: Source, *, single: bool) -> bytes:
        """See `Exporter.encode`."""
        from reroll.export.atif import run_to_atif

        trajectory = run_to_atif(source.run)
        if source.extra and trajectory.extra is not None:
            trajectory.extra["reroll"] |= source.extra
        data = trajectory.to_json_dict()
        return orjson.dumps(data, option=orjson.OPT_INDENT_2 if single else 0) + b"\n"


class VerifiersExporter:
    """verifiers' ``RolloutOutput`` record (`reroll.export.verifiers`), one per line; a job's or
    tree's entries go into ``info``, the index of the run's task into ``example_id``."""

    name = "verifiers"
    summary = "verifiers RolloutOutput records"

    def encode(self, source: Source, *, single: bool) -> bytes:
        """See `Exporter.encode`."""
        from reroll.export.verifiers import run_to_record

        try:
            record = run_to_record(source.run, example_id=source.example_id, info=source.extra)
        except KeyError as exc:
            raise ExportError(f"{source.run.path}: {exc.args[0]}") from exc
        return orjson.dumps(record.model_dump(mode="json")) + b"\n"


EXPORTERS: dict[str, Exporter] = {each.name: each for each in (AtifExporter(), VerifiersExporter())}
"""Every export format, by the name ``--format`` takes."""


def exporter(name: str) -> Exporter:
    """The exporter `name` names.

    Raises:
        ExportError: no format is called `name` (the message lists the known ones); the CLI
            exits with code 2.
    """
    try:
        return EXPORTERS[name]
    except KeyError:
        raise ExportError(f"unknown export format {name!r}; known: {', '.join(sorted(EXPORTERS))}") from None
