"""One LLM exchange: a line of ``trajectory/llm_trajectory.jsonl`` (BenchFlow-compatible).

::

    {"request":  {"timestamp", "method", "path", "headers", "body"},
     "response": {"timestamp", "status_code", "headers", "body", "events", "event_offsets_ms"},
     "duration_ms",
     "metadata": {"step", "thread", "replayed_from", "source", "model", "api_format",
                  "upstream_format", "stream", "ttfb_ms", "divergence", "error", "fault"}}

``body`` is the JSON as sent (for a streamed response: the body a non-streamed request would
have got, assembled from the events by the API format's module: ``chat.completion``,
``response`` or ``message``), ``events`` the raw SSE events in order and ``event_offsets_ms``
when each was received (streamed responses only). ``metadata.api_format`` names the API
(`reroll_proxy.formats`), ``metadata.thread`` the conversation the request belongs to
(`reroll_proxy.threads`: subagents and side calls are threads of their own). Error responses
(4xx / 5xx) are exchanges like any other; an injected fault (`reroll_proxy.faults`) is described
in ``metadata.fault``, and a connection reset, which has no response, is recorded with
``status_code`` 0. Headers are stored without
secrets (`sanitize_headers`). Unknown keys are kept on load, so BenchFlow's files load; the
fields reroll adds have defaults for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from reroll.errors import TrajectoryFormatError

from reroll_proxy.divergence import Divergence
from reroll_proxy.faults import FaultNote
from reroll_proxy.formats import FormatName
from reroll_proxy.sse import SseEvent

ApiFormat = FormatName
Source = Literal["live", "replayed"]
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})
_SECRET_PARTS = ("key", "token", "cookie", "secret")


def sanitize_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers without secrets, names lower-cased.

    Dropped: ``authorization``, ``proxy-authorization``, ``x-api-key``, ``api-key``, ``cookie``
    and every header whose name contains ``key``, ``token``, ``cookie`` or ``secret``.

    Args:
        headers: (name, value) pairs, e.g. ``request.headers.items()``.
    """
    kept: dict[str, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower not in _SECRET_HEADERS and not any(part in lower for part in _SECRET_PARTS):
            kept[lower] = value
    return kept


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class ExchangeRequest(_Record):
    """The request as the agent sent it."""

    timestamp: str
    """When the proxy received it (ISO 8601, UTC)."""
    method: str = "POST"
    path: str
    """The URL path with its query, if any, as the agent sent it, e.g. ``/v1/chat/completions`` or
    ``/v1/messages?beta=true``."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Request headers without secrets."""
    body: Any = None
    """The JSON body (as forwarded upstream for live exchanges, i.e. with the model swapped)."""


class ExchangeResponse(_Record):
    """The response the agent received."""

    timestamp: str
    """When the response was complete (ISO 8601, UTC)."""
    status_code: int
    headers: dict[str, str] = Field(default_factory=dict)
    """Upstream response headers without secrets."""
    body: Any = None
    """The JSON body; for a streamed response the body assembled from the events."""
    events: list[SseEvent] | None = None
    """The raw SSE events in order, for streamed responses only."""
    event_offsets_ms: list[float] | None = None
    """Milliseconds from receiving the request to receiving each event (parallel to `events`)."""


class ExchangeMetadata(_Record):
    """What reroll adds to BenchFlow's shape."""

    step: int | None = None
    """0-based index of the exchange in its rollout."""
    thread: int | None = None
    """The conversation (thread) the request continues, numbered from 0 in order of first
    appearance (`reroll_proxy.threads`; a replay keeps the recording's numbers); None for an
    injected fault and in files written before threads were recorded."""
    replayed_from: int | None = None
    """For a replayed exchange, the 0-based position in the recording of the exchange served
    (the engine matches requests by thread, so it may differ from `step`); None for live ones."""
    source: Source = "live"
    """``live``: answered by the upstream model; ``replayed``: served from a recording."""
    model: str | None = None
    """The model that actually produced the response."""
    api_format: ApiFormat = "openai-chat"
    """The API the exchange spoke: ``openai-chat``, ``openai-responses`` or ``anthropic-messages``."""
    upstream_format: ApiFormat | None = None
    """The API the live upstream spoke when it was not `api_format` (the proxy translated the
    request and the response; both are recorded as the agent sent and received them)."""
    dropped: list[str] | None = None
    """When the proxy translated: what of the agent's request the upstream's API could not
    hold and was left out rather than refused (e.g. ``field thinking``, ``field
    context_management``, ``betas …``); None when nothing was."""
    stream: bool = False
    """Whether the response was streamed (SSE) to the agent."""
    ttfb_ms: float | None = None
    """Milliseconds from receiving the request to the start of the response: the first event
    forwarded (streams) or the whole body ready to send (non-streamed responses)."""
    divergence: Divergence | None = None
    """How the request differed from the recorded one (replayed exchanges only)."""
    error: str | None = None
    """Why the upstream could not answer (connection failure, broken stream), if so."""
    fault: FaultNote | None = None
    """The fault injected at this step (`reroll_proxy.faults`), else None."""


class Exchange(_Record):
    """One line of ``llm_trajectory.jsonl``."""

    request: ExchangeRequest
    response: ExchangeResponse
    duration_ms: float = 0.0
    """Milliseconds from receiving the request to the complete response."""
    metadata: ExchangeMetadata = Field(default_factory=ExchangeMetadata)

    def to_line(self) -> bytes:
        """The exchange as one JSON line, ``\\n``-terminated."""
        return orjson.dumps(self.model_dump(mode="json")) + b"\n"


@dataclass
class LoadedTrajectory:
    """The exchanges of one trajectory file."""

    exchanges: list[Exchange] = field(default_factory=list)
    truncated_line: int | None = None
    """1-based number of an ignored truncated last line (a run killed mid-write), else None."""
    warning: str | None = None
    """Human-readable note about the truncated line, else None."""


def load_trajectory(path: Path) -> LoadedTrajectory:
    """Load ``llm_trajectory.jsonl``.

    A last line without its ``\\n`` that is not valid JSON is a write cut short: it is ignored
    and reported in `LoadedTrajectory.truncated_line` / ``warning``. Blank lines are skipped.

    Args:
        path: the JSONL file.

    Returns:
        The exchanges in file order (an empty file gives none).

    Raises:
        FileNotFoundError: `path` does not exist (the message names it).
        TrajectoryFormatError: any other line is not JSON or not an exchange; the message names
            the file, the 1-based line number and the cause.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"trajectory file not found: {path}") from exc
    lines = data.split(b"\n")
    loaded = LoadedTrajectory()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if number == len(lines):
                loaded.truncated_line = number
                loaded.warning = f"{path}: line {number} is truncated (the run was cut mid-write); ignored"
                break
            raise TrajectoryFormatError(f"{path}: line {number}: invalid JSON ({exc})") from exc
        try:
            loaded.exchanges.append(Exchange.model_validate(raw))
        except ValidationError as exc:
            causes = "; ".join(f"{_location(e['loc'])}: {e['msg']}" for e in exc.errors())
            raise TrajectoryFormatError(f"{path}: line {number}: not an exchange ({causes})") from exc
    return loaded


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(map(str, loc)) or "(line)"
