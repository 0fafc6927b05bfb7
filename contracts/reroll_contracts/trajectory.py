"""The exchange line: one line of ``trajectory/llm_trajectory.jsonl`` (BenchFlow-compatible), the
contract between the LLM proxy (which writes it) and the run folder (which reads it).

::

    {"request":  {"timestamp", "method", "path", "headers", "body"},
     "response": {"timestamp", "status_code", "headers", "body", "events", "event_offsets_ms"},
     "duration_ms",
     "metadata": {"step", "thread", "place", "replayed_from", "source", "model", "api_format",
                  "upstream_format", "translation_notes", "stream", "ttfb_ms", "divergence",
                  "error", "fault", "retry"}}

``body`` is the JSON as sent (for a streamed response: the body a non-streamed request would
have got, assembled from the events by the API format's module: ``chat.completion``,
``response`` or ``message``), ``events`` the raw SSE events in order and ``event_offsets_ms``
when each was received (streamed responses only). ``metadata.api_format`` names the API
(`reroll_contracts.proxy.FormatName`), ``metadata.thread`` the conversation the request belongs to
(`reroll_proxy.threads`: subagents and side calls are threads of their own), ``metadata.place``
where in a trial it was sent (scene, role, turn, round: a `Place`). Error responses
(4xx / 5xx) are exchanges like any other; an injected fault (`reroll_contracts.faults`) is described
in ``metadata.fault``, and a connection reset, which has no response, is recorded with
``status_code`` 0. Headers are stored without
secrets (`sanitize_headers`). Unknown keys are kept on load, so BenchFlow's files load; the
fields reroll adds have defaults for the same reason.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import TrajectoryFormatError
from reroll_contracts.faults import FaultNote
from reroll_contracts.proxy import Divergence, FormatName

MAX_TRAJECTORY_BYTES = 1024**3
"""The largest trajectory file read (a longer one is refused with a clear error, never read)."""
MAX_LINE_BYTES = 1024**3
"""The largest exchange line (a request body is at most 256 MiB; its response and events add to it)."""

ApiFormat = FormatName
Source = Literal["live", "replayed"]
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})
_SECRET_PARTS = ("key", "token", "cookie", "secret")


DONE = "[DONE]"
"""The data of the event that ends an OpenAI stream."""


class SseEvent(BaseModel):
    """One server-sent event."""

    model_config = ConfigDict(extra="allow", frozen=True)

    event: str | None = None
    """The ``event:`` field, or None when the event had none (OpenAI sends none)."""
    data: str
    """The ``data:`` lines joined with ``\\n``."""

    @property
    def is_done(self) -> bool:
        """Whether this is the ``data: [DONE]`` end-of-stream marker."""
        return self.data.strip() == DONE


def sanitize_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers without secrets, names lower-cased.

    Dropped: ``authorization``, ``proxy-authorization``, ``x-api-key``, ``api-key``, ``cookie``
    and every header whose name contains ``key``, ``token``, ``cookie`` or ``secret``.

    Args:
        headers: (name, value) pairs, e.g. ``request.headers.items()``.
    """
    kept: dict[str, str] = {}
    for name, value in headers:
        if (lower := _kept_name(name)) is not None:
            kept[lower] = value
    return kept


@functools.lru_cache(maxsize=1024)
def _kept_name(name: str) -> str | None:
    """`name` lower-cased, or None for a secret header's (decided once per name: the same few
    names come with every exchange)."""
    lower = name.lower()
    secret = lower in _SECRET_HEADERS or any(part in lower for part in _SECRET_PARTS)
    return None if secret else lower


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

    def line_json(self) -> bytes:
        """The request as JSON, as its exchange's line has it (`Exchange.to_line`): the same bytes
        as ``orjson.dumps(model_dump(mode="json"))``, the body given to orjson as it is."""
        return _dumps(_ordered(self, self.model_dump(mode="json", exclude={"body"}), {"body": self.body}))


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


class RetryNote(_Record):
    """Recorded as ``metadata.retry`` of an exchange whose request repeats an earlier attempt."""

    attempt: int = Field(ge=1)
    """1 for the first retry, 2 for the second...: ``x-stainless-retry-count`` when sent, else the
    earlier requests with the same idempotency key."""
    of_step: int | None = None
    """The step of the attempt repeated, when the proxy served it; None when it never arrived."""
    idempotency_key: str | None = None
    """The ``Idempotency-Key`` the attempts shared, if the client sent one."""


class Place(BaseModel):
    """Where in a trial (`reroll.trials.config`) an exchange was sent: set by the controller on the proxy
    (``POST /_reroll/place``) before each turn, recorded as ``metadata.place``."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0)
    """0-based index of the turn in the trial, every scene counted (a User's round is a turn):
    what ``--at TURN:STEP`` names."""
    scene: str
    """The scene's name."""
    role: str
    """The role that acts (its agent sent the request)."""
    round: int | None = Field(default=None, ge=0)
    """The User's round (0-based) in a scene a User drives; None elsewhere."""


class ExchangeMetadata(_Record):
    """What reroll adds to BenchFlow's shape."""

    step: int | None = None
    """0-based index of the exchange in its rollout."""
    thread: int | None = None
    """The conversation (thread) the request continues, numbered from 0 in order of first
    appearance (`reroll_proxy.threads`; a replay keeps the recording's numbers); None for an
    injected fault and in files written before threads were recorded."""
    place: Place | None = None
    """Where in the trial it was sent; None outside a trial turn (files written before trials)."""
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
    translation_notes: list[str] = []
    """What the translation to `upstream_format` dropped from the request, one line each (built-in
    tools, encrypted reasoning, fields the upstream's API has no counterpart for:
    `reroll_proxy.translate.SHEDS`); empty when nothing was dropped."""
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
    """The fault injected at this step (`reroll_contracts.faults.FaultNote`), else None."""
    retry: RetryNote | None = None
    """Set when the request repeats an earlier attempt (an SDK retry: `reroll_contracts.retries`)."""


class Exchange(_Record):
    """One line of ``llm_trajectory.jsonl``."""

    request: ExchangeRequest
    response: ExchangeResponse
    duration_ms: float = 0.0
    """Milliseconds from receiving the request to the complete response."""
    metadata: ExchangeMetadata = Field(default_factory=ExchangeMetadata)

    def to_line(self, request_json: bytes | None = None) -> bytes:
        """The exchange as one JSON line, ``\\n``-terminated: ``orjson.dumps(model_dump(mode="json"))``
        byte for byte, but the bodies and the events (most of a line's bytes, already JSON values)
        go to orjson as they are instead of through pydantic's walk of every value first.

        Args:
            request_json: ``self.request.line_json()`` if the caller made it already (the proxy
                does while the upstream answers, so that it is off the response's path); None:
                made here.
        """
        response = self.response
        request_json = self.request.line_json() if request_json is None else request_json
        dumped = self.model_dump(mode="json", exclude=_BULK)
        events = None if response.events is None else [_event_json(event) for event in response.events]
        dumped["response"] = _ordered(response, dumped["response"], {"body": response.body, "events": events})
        return _dumps({"request": orjson.Fragment(request_json)} | dumped) + b"\n"


_BULK: dict[str, Any] = {"request": True, "response": {"body", "events"}}
"""The parts of an exchange that `Exchange.to_line` serialises with orjson directly."""


def _dumps(value: Any) -> bytes:
    """`value` (what ``model_dump(mode="json")`` gives, bodies left as they are) as JSON bytes."""
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


def _ordered(model: BaseModel, dumped: dict[str, Any], bulk: dict[str, Any]) -> dict[str, Any]:
    """`dumped` (`model` dumped without `bulk`'s fields) with `bulk` put back, in field order
    (then the extra fields), as ``model_dump`` would have them."""
    ordered = {name: bulk[name] if name in bulk else dumped[name] for name in type(model).model_fields}
    return ordered | dumped if len(dumped) + len(bulk) > len(ordered) else ordered


def _event_json(event: SseEvent) -> dict[str, Any]:
    """`event` as ``model_dump(mode="json")`` gives it."""
    extra = event.__pydantic_extra__
    plain = {"event": event.event, "data": event.data}
    return plain | extra if extra else plain


def _json_default(value: Any) -> Any:
    """What orjson cannot serialise itself, as pydantic's JSON mode would give it."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return to_jsonable_python(value)


@dataclass
class LoadedTrajectory:
    """The exchanges of one trajectory file."""

    exchanges: list[Exchange] = field(default_factory=list)
    truncated_line: int | None = None
    """1-based number of an ignored truncated last line (a run killed mid-write), else None."""
    warning: str | None = None
    """Human-readable note about the truncated line, else None."""


def load_trajectory(path: Path, *, root: Path | None = None) -> LoadedTrajectory:
    """Load ``llm_trajectory.jsonl``.

    A last line without its ``\\n`` that is not valid JSON is a write cut short: it is ignored
    and reported in `LoadedTrajectory.truncated_line` / ``warning``. Blank lines are skipped.

    Args:
        path: the JSONL file.
        root: the run folder it lies in: no symlink between it and `path` is followed
            (`reroll_contracts.datafile.read_data_file`); None: only `path` is never followed.

    Returns:
        The exchanges in file order (an empty file gives none).

    Raises:
        FileNotFoundError: `path` does not exist (the message names it).
        TrajectoryFormatError: any other line is not JSON or not an exchange, or longer than
            `MAX_LINE_BYTES`; the file is not a regular file (a device, a FIFO), larger than
            `MAX_TRAJECTORY_BYTES`, or a symlink (never followed); the message names the file,
            the 1-based line number and the cause.
    """
    try:
        data = read_capped(path, MAX_TRAJECTORY_BYTES, root=root)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"trajectory file not found: {path}") from exc
    except (OSError, ValueError) as exc:
        raise TrajectoryFormatError(f"{path}: {_reason(exc)}") from exc
    lines = data.split(b"\n")
    loaded = LoadedTrajectory()
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE_BYTES:
            raise TrajectoryFormatError(f"{path}: line {number} is larger than {MAX_LINE_BYTES} bytes")
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


def read_capped(path: Path, limit_bytes: int, *, root: Path | None = None) -> bytes:
    """The content of the regular file `path`, refused beyond `limit_bytes`: see
    `reroll_contracts.datafile.read_data_file` (no symlink followed, no FIFO waited on).

    Raises:
        FileNotFoundError: `path` does not exist.
        OSError: it cannot be opened or read (no permission).
        ValueError: a `DataFileError`: a symlink, not a regular file, or larger than `limit_bytes`.
    """
    return read_data_file(path, limit_bytes, root=root)


def _reason(exc: OSError | ValueError) -> str:
    """`exc` as the end of a message that names the file."""
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(map(str, loc)) or "(line)"
