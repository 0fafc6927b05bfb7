"""The contract between the controller and its child processes: one typed model per message.

Both sides import these models (the proxy never imports the controller); every model forbids
unknown fields, so a field added on one side only fails loudly instead of being dropped.

- `ProxyConfig` (with `UpstreamConfig`, `ReplayConfig` and `reroll_contracts.faults.FaultsUsed`:
  what to replay, where to go live, which faults to inject): the controller writes
  ``ProxyConfig(...).model_dump_json()`` to the proxy's config file, the proxy reads it with
  `reroll_proxy.config.load_config`. The upstream key and the controller's token are never in
  the file: `UpstreamConfig.api_key` and `ProxyConfig.controller_token` are excluded from every
  dump, and ``api_key_env`` / ``controller_token_env`` name the environment variables that carry
  them to the proxy.
- `ProxyStatus`: the body of ``GET /_reroll/status`` (the engine's counters, divergences, stop).
- `ProxyStop`: why the proxy refuses every further request (replay-only reached the cut point,
  or a strict divergence aborted the replay). The proxy records it *before* it sends the 409
  that tells the agent, and pushes it: ``GET /_reroll/stop`` answers as soon as it happens
  (long poll), so the controller stops a running agent at once, and a status read after the
  agent exited always carries it — an agent that exits right after the 409 cannot race it.
- `ReadyFile`: what a child process (LLM proxy, scripted model server, HTTPS interceptor,
  sidecar) writes once it listens, read by `reroll.host.child_process.ChildProcess`. The interceptor runs
  under mitmproxy's interpreter and the sidecar ships without pydantic: both write the same
  JSON object with the standard library, and the controller validates it against this model.
- `DivergencePolicy`: what the proxy does with a replayed request that differs from the recording.
- `HeldStep`, `FreezePlan`: a request held at a step boundary for a checkpoint (``GET
  /_reroll/held``), and the pool snapshot the proxy takes itself at each such step instead
  (``POST /_reroll/freeze``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from reroll_contracts.faults import FaultsUsed

FormatName = Literal["openai-chat", "openai-responses", "anthropic-messages"]


Classification = Literal["observation_changed", "agent_changed"]


class Divergence(BaseModel):
    """Where a live request first differs from the recorded one."""

    message_index: int | None
    """0-based index of the first differing message in the normalised conversation (the system
    prompt is message 0 when the format carries it outside the list); None when the
    difference is not in a message."""
    field: str
    """What differs, as a path: ``messages[3].content[0].text``, ``message_count``,
    ``tools[1].parameters``, ``params.temperature``, ``api_format``."""
    classification: Classification = "agent_changed"
    """``observation_changed`` (a user or tool message differs) or ``agent_changed`` (the rest)."""
    summary: str
    """One line for humans."""
    diff: str
    """Unified diff (recorded → live) of the differing values, at most `MAX_DIFF_LINES` lines."""


class ClientLimits(BaseModel):
    """The limits of one client connection to the proxy (`ProxyConfig.client_limits`)."""

    model_config = ConfigDict(extra="forbid")

    header_timeout_seconds: float = Field(default=30.0, gt=0)
    """A connection that has not sent a complete request head this long after it opened (or
    after its last response, between keep-alive requests) is closed."""
    body_timeout_seconds: float = Field(default=60.0, gt=0)
    """A request whose body has not fully arrived this long after its head gets a 408."""
    max_request_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Largest request body accepted (413 beyond; long conversations exceed aiohttp's 1 MiB default)."""


class VolatileRule(BaseModel):
    """One part of a request that may differ between a recording and its replay (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(default=None, min_length=1)
    """A dotted path into the request body whose value is dropped; ``*`` matches every key or element."""
    pattern: str | None = Field(default=None, min_length=1)
    """A regular expression; every match inside a string of the body is replaced by ``<label>``."""
    value: str | None = Field(default=None, min_length=1)
    """A literal string (e.g. the sandbox's workspace path); every occurrence is replaced by ``<label>``."""
    label: str = Field(default="volatile", min_length=1)
    """What a replaced part reads as in bodies compared and in divergence diffs: ``<label>``."""

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        kinds = [name for name in ("path", "pattern", "value") if getattr(self, name) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"a volatile rule has exactly one of path, pattern, value (got {kinds or 'none'})"
            )
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern {self.pattern!r} is not a regular expression: {exc}") from exc
        return self


DivergencePolicy = Literal["warn", "strict", "cutover"]
"""On a replayed request that differs from the recording: ``warn`` serves the recording and notes
it, ``strict`` answers 409 and aborts, ``cutover`` goes live from that request on (409 and abort,
like ``strict``, without an upstream)."""


class ReplayConfig(BaseModel):
    """What the proxy replays before it goes live (`ProxyConfig.replay`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_path: Path
    """The recorded ``llm_trajectory.jsonl``."""
    cut_index: int | None = Field(default=None, ge=0)
    """How many recorded exchanges to serve before the live model takes over [default: all of them]."""
    divergence_policy: DivergencePolicy = "warn"
    """See `DivergencePolicy`."""


class UpstreamConfig(BaseModel):
    """The live model the proxy forwards to."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    """The provider's base URL ending in ``/v1``, e.g. ``https://api.openai.com/v1``,
    ``https://api.anthropic.com/v1`` or ``http://127.0.0.1:8000/v1``; a request goes to
    ``base_url`` + its format's path (``/chat/completions``, ``/responses``, ``/messages``)."""
    api_key: str | None = Field(default=None, repr=False, exclude=True)
    """Sent upstream as the format wants it (``Authorization: Bearer`` for OpenAI, ``x-api-key``
    for Anthropic); None sends no credentials. Never dumped: a config file carries `api_key_env`."""
    api_key_env: str | None = None
    """The environment variable holding `api_key`, resolved by `reroll_proxy.config.load_config`
    (so the key never reaches the disk); None: no indirection."""
    model: str | None = None
    """When set, replaces ``model`` in every live request body (how the live model is swapped)."""
    api_format: FormatName | None = None
    """The API the upstream speaks; when it differs from the agent's request, the proxy
    translates (`reroll_proxy.translate`). None: whatever the agent speaks."""
    timeout_seconds: float = Field(default=600.0, gt=0)
    """Longest wait for the upstream to connect, to start answering, and between two chunks of a stream."""


class ProxyConfig(BaseModel):
    """One rollout's proxy."""

    model_config = ConfigDict(extra="forbid")

    listen_host: str = "127.0.0.1"
    """Interface to listen on."""
    listen_port: int = Field(default=0, ge=0, le=65535)
    """TCP port; 0 picks a free one (see the ready file / `RunningProxy.port`)."""
    token: str = Field(min_length=1, repr=False)
    """The per-rollout token the agent presents (``Authorization: Bearer``, ``x-api-key`` or
    ``api-key``); it opens the model endpoints only, never ``/_reroll/*``."""
    controller_token: str | None = Field(default=None, min_length=1, repr=False, exclude=True)
    """The controller's own token, the only credential ``/_reroll/*`` accepts (same headers as
    `token`); the sandbox never sees it. None: those endpoints refuse every request. Never
    dumped: a config file carries `controller_token_env`."""
    controller_token_env: str | None = None
    """The environment variable holding `controller_token`, resolved by
    `reroll_proxy.config.load_config` (so the token never reaches the disk); None: no indirection."""
    trajectory_path: Path
    """Output JSONL: every served exchange is appended here."""
    replay: ReplayConfig | None = None
    """The recording to replay before going live; None records only."""
    upstream: UpstreamConfig | None = None
    """The live model after the cut; None is replay-only (requests past the cut get 409)."""
    replay_timing_factor: float = Field(default=0.0, ge=0)
    """A replayed stream waits the recorded time between two events times this factor: 0 sends
    them as fast as possible, 1 at the recorded pace."""
    fsync_each_exchange: bool = True
    """``fsync`` each trajectory line (while its response is sent, before the next line is
    written), so the file survives a machine crash; False only flushes lines to the OS (they
    still survive the proxy being killed). See `reroll_proxy.recorder`."""
    faults: FaultsUsed | None = None
    """The fault plan (`reroll_contracts.faults`) applied to the exchanges served; None injects none."""
    ready_file: Path | None = None
    """Written atomically once listening (a `ReadyFile`)."""
    volatile: list[VolatileRule] = []
    """The parts of a request that may differ between the recording and its replay (the
    sandbox's paths, the agent's declared ones): removed from both before matching and
    divergence checks (`reroll_proxy.volatile`)."""
    hold_every: int = Field(default=0, ge=0)
    """Hold every live request whose step is a positive multiple of this (and one a replay-only
    proxy refuses at such a step, before it refuses it) until the controller releases it (``GET
    /_reroll/held``, ``POST /_reroll/release``): the agent waits for its model at a step boundary
    while the controller captures a checkpoint; 0: never hold."""
    max_steps: int | None = Field(default=None, ge=1)
    """Serve at most this many steps (replayed, live and injected faults alike), then refuse every
    request with a 409 and stop (``step_limit``); None: no limit."""
    client_limits: ClientLimits = Field(default_factory=ClientLimits)
    """How long a client may take to send a request, and how large it may be (`reroll_proxy.limits`)."""


class FreezePlan(BaseModel):
    """What the controller sends a proxy (``POST /_reroll/freeze``) so that at each held step it
    freezes the sandbox itself instead of holding the request until a release: the pool snapshot
    ``step-K`` of the isolated ``local`` sandbox's btrfs disk (`reroll_contracts.btrfs.freeze`:
    about 3 ms, no round trip to the controller), then ``GET /_reroll/held`` tells the controller
    (`HeldStep` with ``frozen``). Host paths, from the controller only (the sandbox never names
    them): the proxy runs on the host, as the controller's user."""

    model_config = ConfigDict(extra="forbid")

    snapshots: Path
    """The disk's snapshots folder: step K's snapshot goes into ``<snapshots>/step-K/``."""
    sources: list[Path] = Field(min_length=1)
    """The subvolumes frozen, in order (the workspace's and HOME's)."""
    paths: list[str] = Field(min_length=1)
    """Their sandbox paths, in the same order."""
    root: Path | None = None
    """The subvolume of the sandbox's ``/``, frozen too; None: not."""

    @model_validator(mode="after")
    def _paired(self) -> Self:
        if len(self.paths) != len(self.sources):
            raise ValueError("one sandbox path per source subvolume")
        return self

    def step_folder(self, step: int) -> Path:
        """Where the snapshot of step `step` goes."""
        return self.snapshots / f"step-{step}"


class HeldStep(BaseModel):
    """The proxy's answer to ``GET /_reroll/held``: a request of `step` was held (until ``POST
    /_reroll/release``), or, with a `FreezePlan`, frozen and let go at once."""

    model_config = ConfigDict(extra="forbid")

    step: int
    frozen: bool = False
    """The proxy took step `step`'s snapshot itself (`FreezePlan`) and held nothing further."""
    held_seconds: float | None = None
    """With `frozen`: how long the request waited for the snapshot."""
    error: str | None = None
    """With `frozen`: why the snapshot failed (the request went on all the same)."""


class RolloutRegistration(BaseModel):
    """What the controller sends a shared proxy (``POST /_reroll/rollouts``, with the proxy's
    admin token) to have it serve one more rollout. Over loopback only: it carries the rollout's
    secrets, which a config file never does."""

    model_config = ConfigDict(extra="forbid")

    config: ProxyConfig
    """The rollout's proxy configuration (`ProxyConfig.ready_file` is not used)."""
    controller_token: str = Field(min_length=1, repr=False)
    """Opens that rollout's ``/_reroll/status``, ``stop`` and ``place``."""
    upstream_api_key: str | None = Field(default=None, repr=False)
    """The upstream's key (`UpstreamConfig.api_key`), None: none is sent."""

    def resolved(self) -> ProxyConfig:
        """`config` with its controller token and upstream key in place."""
        upstream = self.config.upstream
        if upstream is not None:
            upstream = upstream.model_copy(update={"api_key": self.upstream_api_key, "api_key_env": None})
        return self.config.model_copy(
            update={
                "controller_token": self.controller_token,
                "controller_token_env": None,
                "upstream": upstream,
            }
        )


class RolloutAdded(BaseModel):
    """A shared proxy's answer to a `RolloutRegistration`."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(min_length=1)
    """Names the rollout in ``DELETE /_reroll/rollouts/{rollout_id}``."""
    base_url: str = Field(min_length=1)
    """The URL its agent uses, ``http://HOST:PORT/v1``."""


class ProxyStop(BaseModel):
    """Why the proxy refuses every request from now on (each refused with a 409)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["replay_exhausted", "replay_diverged", "step_limit"]
    """``replay_exhausted``: replay-only mode served every recorded exchange up to the cut;
    ``replay_diverged``: a replayed request differed from the recording under the ``strict``
    policy (or ``cutover`` without an upstream); ``step_limit``: the rollout served its
    `ProxyConfig.max_steps` steps."""
    step: int = Field(ge=0)
    """The step the first refused request would have had."""
    reason: str
    """One line for humans (for ``replay_diverged``: the step and the divergence's summary)."""


class StepDivergence(Divergence):
    """A divergence seen at a step."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    """The step of the replayed request that differed."""


class ProxyStatus(BaseModel):
    """The proxy's counters (``GET /_reroll/status``)."""

    model_config = ConfigDict(extra="forbid")

    served_replayed: int = Field(default=0, ge=0)
    """Requests answered from the recording."""
    served_live: int = Field(default=0, ge=0)
    """Requests forwarded to the live upstream."""
    cut_index: int = Field(default=0, ge=0)
    """How many recorded exchanges are replayed before going live."""
    divergence_policy: DivergencePolicy = "warn"
    """The policy in force."""
    cutover_step: int | None = None
    """The step at which the ``cutover`` policy went live early, else None."""
    divergences: list[StepDivergence] = []
    """Every divergence seen, in step order."""
    stop: ProxyStop | None = None
    """Set (before the first 409 is sent) once the proxy refuses every further request."""
    websocket_upgrades_refused: int = Field(default=0, ge=0)
    """Responses WebSocket upgrades answered with 426 (`reroll_proxy.endpoints_websocket`)."""


class ReadyFile(BaseModel):
    """What a child process writes atomically (temp file + rename) once it listens."""

    model_config = ConfigDict(extra="forbid")

    pid: int = Field(gt=0)
    """The listening process's id."""
    address: str = Field(min_length=1)
    """Where clients reach it: the LLM proxy and the scripted model server give their base URL
    (``http://HOST:PORT/v1``), the interceptor its ``http://HOST:PORT`` (the ``HTTPS_PROXY``
    value), the sidecar its gRPC target (``unix:/PATH`` or ``HOST:PORT``)."""
