"""What a run's page shows, computed from a loaded run folder (pure, except `attached_files`).

The conversation comes from `reroll.runfolder.conversation` (the same turns the exports write,
whatever wire format the agent spoke); the rest from the exchanges' metadata: where the live model
took over (the cutover), divergences, injected faults, and when each exchange and each command
happened, as offsets in seconds from the first request.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import orjson
from reroll_contracts.proxy import Divergence
from reroll_contracts.trajectory import Exchange
from reroll_contracts.wire.normal import NormalUsage

from reroll.runfolder.asks import AskRecord, load_asks
from reroll.runfolder.conversation import Thread, ToolCallTurn, ToolResult, Turn, threads_of
from reroll.runfolder.paths import RunPaths
from reroll.runfolder.run import (
    SIDE_LABELS,
    BranchedFrom,
    ContinuedFrom,
    RunFolder,
)
from reroll.runfolder.summary import primary_reward

MAX_FILE_BYTES = 64 * 1024
"""Most bytes shown of one attached file (verifier output, agent log): the last ones."""
MAX_FILES = 20
"""Most files shown from one folder (verifier/)."""


@dataclass
class ExchangeRow:
    """One exchange in the timeline."""

    index: int
    """0-based position in the trajectory file (the proxy's step)."""
    thread: int | None
    source: str
    """``live`` or ``replayed``."""
    model: str | None
    status_code: int
    start_seconds: float
    """Seconds from the run's first request to this one."""
    duration_ms: float
    ttfb_ms: float | None
    tokens: int | None
    """Prompt + completion tokens the response reported (None: it says nothing)."""
    divergence: Divergence | None
    fault: str | None
    """The injected fault, as ``rule: {spec}``."""
    error: str | None


@dataclass
class CommandRow:
    """One tool call of the agent, with what it returned."""

    index: int
    """The exchange whose answer made the call."""
    start_seconds: float
    """Seconds from the run's first request to the answer that made the call."""
    tool: str
    command: str
    """The ``command`` argument when there is one, else the arguments as JSON."""
    output: str | None
    """The tool result the next request sent back (None: there was no next request)."""
    is_error: bool


@dataclass
class AttachedFile:
    """The text of a file of the run folder (its last `MAX_FILE_BYTES` bytes)."""

    name: str
    text: str
    cut_bytes: int
    """Bytes left out at the start (0: the whole file)."""


@dataclass
class SideView:
    """A side model's trajectory (`reroll.runfolder.run.SIDE_TRAJECTORIES`): its conversation and
    exchanges, positioned as the agent's are."""

    name: str
    """Its key: ``judge`` or ``user``."""
    label: str
    """What the page calls its model (``judge``, ``persona``)."""
    threads: list[Thread]
    exchange_index: dict[int, int]
    """``id(exchange)`` → its position in the side trajectory."""
    exchanges: list[ExchangeRow]
    warning: str | None
    """The side trajectory's truncated last line, if any."""

    @property
    def total_seconds(self) -> float:
        """From its first request to its last response (its timeline's width), at least 0.001."""
        return span_seconds(self.exchanges)

    def index_of(self, turn: Turn) -> int:
        """The side trajectory position of the exchange holding `turn`."""
        return self.exchange_index[id(turn.exchange)]


@dataclass
class RunView:
    """Everything a run's page shows."""

    run: RunFolder
    title: str
    status: str
    reward: float | None
    threads: list[Thread]
    exchange_index: dict[int, int]
    """``id(exchange)`` → its position in the trajectory (for turns, which hold the exchange)."""
    cut_index: int | None
    """Exchanges replayed before the live model took over; None for a run that is no continuation."""
    provenance: ContinuedFrom | BranchedFrom | None
    exchanges: list[ExchangeRow]
    commands: list[CommandRow]
    total_seconds: float
    """From the first request to the last response (the timeline's width), at least 0.001."""
    verifier_files: list[AttachedFile] = field(default_factory=list)
    agent_log: AttachedFile | None = None
    asks: list[AskRecord] = field(default_factory=list)
    """The agent's ask_user questions and their answers (`reroll.runfolder.asks`)."""
    sides: list[SideView] = field(default_factory=list)
    """The judge's and the persona User's trajectories, those the run has."""

    @property
    def divergent(self) -> list[ExchangeRow]:
        """The exchanges with a divergence, in order."""
        return [row for row in self.exchanges if row.divergence is not None]

    @property
    def faulted(self) -> list[ExchangeRow]:
        """The exchanges with an injected fault, in order."""
        return [row for row in self.exchanges if row.fault is not None]

    def index_of(self, turn: Turn) -> int:
        """The trajectory position of the exchange holding `turn`."""
        return self.exchange_index[id(turn.exchange)]

    def unanswered_before(self, thread: Thread) -> dict[int, list[ExchangeRow]]:
        """The exchanges of `thread` that got no answer (an error status, an injected fault, a
        reset), by the position in `thread.turns` of the answer that followed them
        (``len(thread.turns)`` for those after the last answer)."""
        positions = {
            id(turn.exchange): position
            for position, turn in enumerate(thread.turns)
            if turn.source == "agent" and not turn.from_request
        }
        placed: dict[int, list[ExchangeRow]] = {}
        pending: list[ExchangeRow] = []
        for exchange in thread.exchanges:
            position = positions.get(id(exchange))
            if position is None:
                pending.append(self.exchanges[self.exchange_index[id(exchange)]])
            elif pending:
                placed[position], pending = pending, []
        if pending:
            placed[len(thread.turns)] = pending
        return placed

    def cutover_before(self, thread: Thread) -> int | None:
        """The position in `thread.turns` of the first answer of the live model (the cutover
        marker goes before it); None when the thread has none or the run is no continuation."""
        if self.cut_index is None:
            return None
        for position, turn in enumerate(thread.turns):
            if turn.source == "agent" and not turn.from_request and self.index_of(turn) >= self.cut_index:
                return position
        return None


def run_view(run: RunFolder, *, attach_files: bool = True) -> RunView:
    """The page contents of `run`.

    Args:
        run: a loaded run folder (`reroll.runfolder.run.load_run_folder`).
        attach_files: read the verifier's files and the agent's log (last `MAX_FILE_BYTES` each).

    Raises:
        KeyError: an exchange (the agent's or a side model's) names an unknown API format.
        RunFolderError: the run's asks.json is invalid.
    """
    exchanges = run.exchanges
    threads, rows, index = _timeline(exchanges)
    provenance = run.config.continued_from or run.config.branched_from
    starts = {row.index: row.start_seconds for row in rows}
    commands = [
        CommandRow(
            index=index[id(turn.exchange)],
            start_seconds=starts[index[id(turn.exchange)]] + turn.exchange.duration_ms / 1000,
            tool=call.name,
            command=command_text(call.arguments),
            output=result.content if result is not None else None,
            is_error=result.is_error if result is not None else False,
        )
        for thread in threads
        for turn in thread.turns
        if turn.source == "agent" and not turn.from_request
        for call, result in calls_and_results(turn)
    ]
    commands.sort(key=lambda command: (command.start_seconds, command.index))
    result = run.result
    view = RunView(
        run=run,
        title=" · ".join(
            (run.config.task_name or Path(run.config.task_path).name, run.config.agent, run.path.name)
        ),
        status=result.effective_status if result is not None else "unknown",
        reward=primary_reward(result.rewards) if result is not None else None,
        threads=threads,
        exchange_index=index,
        cut_index=provenance.cut_index if provenance is not None else None,
        provenance=provenance,
        exchanges=rows,
        commands=commands,
        total_seconds=span_seconds(rows),
        asks=load_asks(run.path),
        sides=[_side_view(side, loaded.exchanges, loaded.warning) for side, loaded in run.sides.items()],
    )
    if attach_files:
        paths = RunPaths(run.path)
        view.verifier_files = attached_files(paths.verifier.root)
        view.agent_log = _attached(paths.agent_log)
    return view


def _side_view(side: str, exchanges: list[Exchange], warning: str | None) -> SideView:
    threads, rows, index = _timeline(exchanges)
    return SideView(side, SIDE_LABELS[side], threads, index, rows, warning)


def _timeline(exchanges: list[Exchange]) -> tuple[list[Thread], list[ExchangeRow], dict[int, int]]:
    """The threads of `exchanges`, a row per exchange (times from the first request) and each
    exchange's position by ``id``."""
    threads = threads_of(exchanges)
    first = _seconds(exchanges[0].request.timestamp) if exchanges else None
    usages = {
        id(turn.exchange): turn.usage
        for thread in threads
        for turn in thread.turns
        if turn.source == "agent" and not turn.from_request
    }
    rows = [
        _exchange_row(index, exchange, first, usages.get(id(exchange)))
        for index, exchange in enumerate(exchanges)
    ]
    return threads, rows, {id(exchange): position for position, exchange in enumerate(exchanges)}


def span_seconds(rows: list[ExchangeRow]) -> float:
    """Seconds from the first request of `rows` to their last response, at least 0.001."""
    return max(max((row.start_seconds + row.duration_ms / 1000 for row in rows), default=0.0), 0.001)


def attached_files(folder: Path) -> list[AttachedFile]:
    """The regular files directly in `folder`, by name (at most `MAX_FILES`), each's last
    `MAX_FILE_BYTES` bytes as text; links, FIFOs and sub-folders are left out, never followed."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    files = [_attached(folder / name) for name in names]
    return [file for file in files if file is not None][:MAX_FILES]


def _attached(path: Path) -> AttachedFile | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        cut = max(0, info.st_size - MAX_FILE_BYTES)
        file.seek(cut)
        data = file.read(MAX_FILE_BYTES)
    return AttachedFile(path.name, data.decode("utf-8", errors="replace"), cut)


def _exchange_row(
    index: int, exchange: Exchange, first: float | None, usage: NormalUsage | None
) -> ExchangeRow:
    metadata = exchange.metadata
    counted = [usage["prompt_tokens"], usage["completion_tokens"]] if usage else []
    tokens = sum(count or 0 for count in counted) if any(c is not None for c in counted) else None
    start = _seconds(exchange.request.timestamp)
    fault = metadata.fault
    return ExchangeRow(
        index=index,
        thread=metadata.thread,
        source=metadata.source,
        model=metadata.model,
        status_code=exchange.response.status_code,
        start_seconds=max(0.0, start - first) if start is not None and first is not None else 0.0,
        duration_ms=exchange.duration_ms,
        ttfb_ms=metadata.ttfb_ms,
        tokens=tokens,
        divergence=metadata.divergence,
        fault=f"{fault.rule}: {orjson.dumps(fault.spec.model_dump()).decode()}" if fault else None,
        error=metadata.error,
    )


def _seconds(timestamp: str) -> float | None:
    try:
        return datetime.fromisoformat(timestamp).timestamp()
    except ValueError:
        return None


def command_text(arguments: dict[str, object]) -> str:
    """A tool call's command: its ``command`` (or ``cmd``) argument, else the arguments as JSON."""
    command = arguments.get("command") or arguments.get("cmd")
    if isinstance(command, str):
        return command
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        return " ".join(command)
    return orjson.dumps(arguments).decode()


def calls_and_results(turn: Turn) -> list[tuple[ToolCallTurn, ToolResult | None]]:
    """`turn`'s tool calls, each with its result, paired by position (None: the call got none)."""
    results: list[ToolResult | None] = list(turn.results[: len(turn.tool_calls)])
    results += [None] * (len(turn.tool_calls) - len(results))
    return list(zip(turn.tool_calls, results, strict=True))
