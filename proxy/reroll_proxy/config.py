"""The proxy's configuration: one `ProxyConfig` per rollout, usually from a JSON file.

In a config file the upstream key may be given indirectly as ``"api_key_env": "NAME"`` (the
environment variable holding it), so the key is never written to disk; `load_config` resolves
it. Neither the key nor the agent token is ever logged or recorded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reroll_proxy.formats import FormatName


class ProxyConfigError(ValueError):
    """A config file is missing, not JSON, or invalid; the message names the file."""


class UpstreamConfig(BaseModel):
    """The live model the proxy forwards to."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    """The provider's base URL ending in ``/v1``, e.g. ``https://api.openai.com/v1``,
    ``https://api.anthropic.com/v1`` or ``http://127.0.0.1:8000/v1``; a request goes to
    ``base_url`` + its format's path (``/chat/completions``, ``/responses``, ``/messages``)."""
    api_key: str | None = Field(default=None, repr=False)
    """Sent upstream as the format wants it (``Authorization: Bearer`` for OpenAI, ``x-api-key``
    for Anthropic); None sends no credentials."""
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
    """The per-rollout token the agent presents (``Authorization: Bearer``, ``x-api-key`` or ``api-key``)."""
    trajectory_path: Path
    """Output JSONL: every served exchange is appended here."""
    replay_path: Path | None = None
    """A recorded JSONL to replay before going live; None records only."""
    cut_index: int | None = Field(default=None, ge=0)
    """How many recorded exchanges to replay (default: all of them); must be 0 or None without
    `replay_path`."""
    upstream: UpstreamConfig | None = None
    """The live model after the cut; None is replay-only (requests past the cut get 409)."""
    divergence_policy: Literal["warn", "strict", "cutover"] = "warn"
    """On a replayed request that differs from the recording: ``warn`` serves the recording and
    notes it, ``strict`` answers 409 and aborts, ``cutover`` goes live from that request on
    (409 and abort, like ``strict``, without an upstream)."""
    replay_timing_factor: float = Field(default=0.0, ge=0)
    """A replayed stream waits the recorded time between two events times this factor: 0 sends
    them as fast as possible, 1 at the recorded pace."""
    fsync_each_exchange: bool = True
    """``fsync`` each trajectory line (while its response is sent, before the next line is
    written), so the file survives a machine crash; False only flushes lines to the OS (they
    still survive the proxy being killed). See `reroll_proxy.recorder`."""
    faults_path: Path | None = None
    """A YAML fault plan (`reroll_proxy.faults`) applied to the exchanges served; None injects none."""
    fault_seed: int | None = None
    """Seed of the plan's probability draws [default: the plan's ``seed``]."""
    ready_file: Path | None = None
    """Written atomically once listening: ``{"port", "pid", "base_url"}``."""


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> ProxyConfig:
    """Read a JSON config file; ``upstream.api_key_env`` names the variable holding the key.

    Args:
        path: the JSON file.
        environ: where ``api_key_env`` is looked up (default: ``os.environ``).

    Returns:
        The validated config.

    Raises:
        ProxyConfigError: the file is missing, not JSON, invalid, or names an unset variable.
    """
    try:
        raw: Any = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ProxyConfigError(f"{path}: cannot read the proxy config ({exc.strerror or exc})") from exc
    except orjson.JSONDecodeError as exc:
        raise ProxyConfigError(f"{path}: not JSON ({exc})") from exc
    upstream = raw.get("upstream") if isinstance(raw, dict) else None
    if isinstance(upstream, dict) and (variable := upstream.pop("api_key_env", None)):
        env = os.environ if environ is None else environ
        if variable not in env:
            raise ProxyConfigError(f"{path}: upstream.api_key_env names {variable!r}, which is not set")
        upstream.setdefault("api_key", env[variable])
    try:
        return ProxyConfig.model_validate(raw)
    except ValidationError as exc:
        raise ProxyConfigError(f"{path}: invalid proxy config:\n{exc}") from exc
