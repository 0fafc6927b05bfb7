"""The HTTP front end of the proxy, around a `ReplayEngine`: `start_proxy` serves one rollout,
`start_shared` any number (added and removed by the controller). The parts: `reroll_proxy.front`
(the HTTP/1.1 server), `reroll_proxy.host` (one server, each request routed to its rollout by its
token, `reroll_proxy.auth`),
`reroll_proxy.rollout` (one rollout's handlers), `reroll_proxy.replayed` and `reroll_proxy.live`
(serving a step from the recording or from the live model), `reroll_proxy.upstream` (the
`Upstream` seam to the model provider, and its in-memory twin for tests).

Routes (every one but ``/healthz`` needs a token, else 401 with an error in the API's shape): the
model endpoints take the rollout token (the agent's) and nothing else; ``/_reroll/*`` (the
controller's channel: whatever route is registered under it) takes the controller's token
(``controller_token``, which the sandbox never sees) and nothing else — the rollout token gets
403 there, so an agent can neither forge the trial place nor read the status. Tokens are compared
in constant time (`secrets.compare_digest`).

- the API paths of every format in `reroll_proxy.formats` (``POST /v1/chat/completions``,
  ``/v1/responses``, ``/v1/messages``, each also without ``/v1``) — the engine decides per
  request: replay the recorded response (SSE events re-emitted in order, one write each, paced
  by ``replay_timing_factor``, when the request streams; a recorded error status as it was),
  forward to the live upstream (a stream's bytes forwarded as they arrive), or refuse with 409
  (``replay_diverged`` under the strict policy, ``replay_exhausted`` past the cut in replay-only
  mode; neither is recorded). Faults of the plan (``faults``) are injected by
  `reroll_proxy.inject`, and a replayed line that records a fault reproduces it. Every served
  response, upstream errors included, is appended to the trajectory before the agent can see
  its end (see `reroll_proxy.recorder`); an SDK retry (``x-stainless-retry-count`` > 0, or an
  ``Idempotency-Key`` seen before) is recorded with ``metadata.retry`` (`reroll_proxy.retries`).
  An unreachable upstream gives 502 (recorded, with ``metadata.error``). An upstream of another
  API format (``upstream.api_format``) gets the request translated, and the agent the answer
  translated back (`reroll_proxy.translate`).
- ``GET /v1/responses`` (and ``/responses``) — a Responses WebSocket upgrade, refused at once
  with 426 so the client falls back to HTTP (`reroll_proxy.endpoints_websocket`).
- ``POST /v1/messages/count_tokens``, ``GET /v1/models`` (each also without ``/v1``): answered
  beside the trajectory, see `reroll_proxy.endpoints_models`.
- ``GET /_reroll/status`` — the engine's counters, divergences and stop: a
  `reroll_contracts.proxy.ProxyStatus`.
- ``GET /_reroll/stop`` — a long poll: answers a `reroll_contracts.proxy.ProxyStop` once the proxy
  refuses every further request (replay-only cut point, strict divergence). The stop is set
  before the first 409 is sent, so it is in every status read after the agent saw that 409.
- ``POST /_reroll/place`` — the controller says where in a trial the next requests are sent
  (a `reroll_contracts.trajectory.Place`, the body); every exchange served from then on records it as
  ``metadata.place``. Answers 204; 400 for a body that is not a Place.
- ``POST /reroll/ask_user`` (the rollout token), ``GET /_reroll/asks``, ``POST /_reroll/asks/{id}``
  — the agent's ask_user questions, held until the controller answers: `reroll_proxy.asks`.
- ``GET /_reroll/held`` — a long poll: answers ``{"step": K}`` once a live request of step K
  (a positive multiple of ``hold_every``), or one past a replay-only cut, is held, unanswered;
  ``POST /_reroll/release?step=K`` lets it go on (``{"held_seconds": s}``, how long it was held;
  404 for a step not held). The controller captures a checkpoint in between.
- ``POST /_reroll/freeze`` — a `reroll_contracts.proxy.FreezePlan`: from then on the proxy takes
  the sandbox's pool snapshot itself at each such step (a few ms of btrfs ioctls) and lets the
  request go on at once; ``/_reroll/held`` then answers ``{"step": K, "frozen": true,
  "held_seconds": s, "error": null}``.
- ``GET /healthz`` — ``{"ok": true}``, no auth.

Upstream credentials are only ever sent upstream: never to the agent, never to disk.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from reroll_contracts.proxy import ClientLimits, ProxyConfig
from reroll_contracts.service import base_url_for, write_ready_file

from reroll_proxy.front import RouteDef
from reroll_proxy.host import ProxyHost
from reroll_proxy.rollout import RolloutProxy
from reroll_proxy.upstream import Upstream

__all__ = ["ProxyHost", "RolloutProxy", "RunningProxy", "start_proxy", "start_shared"]

log = logging.getLogger("reroll_proxy")


class RunningProxy:
    """A proxy serving one rollout in this process (from `start_proxy`)."""

    def __init__(self, host: ProxyHost, rollout: RolloutProxy) -> None:
        self.host = host
        self.rollout = rollout
        """Its handlers; ``rollout.engine`` holds the counters."""

    @property
    def port(self) -> int:
        """The TCP port it listens on."""
        return self.rollout.address[1]

    @property
    def base_url(self) -> str:
        """The URL to give the agent, ``http://HOST:PORT/v1``."""
        return self.rollout.base_url

    async def stop(self) -> None:
        """Stop listening, close the upstream session and the trajectory file."""
        await self.host.stop()


async def start_proxy(config: ProxyConfig, upstream: Upstream | None = None) -> RunningProxy:
    """Serve one rollout: load the replay, open the trajectory, listen, and write the ready file
    (if configured).

    Args:
        config: the proxy's configuration.
        upstream: where live requests go; None: over HTTP to ``config.upstream`` (an
            `reroll_proxy.upstream.InMemoryUpstream` here serves a test without a provider).

    Returns:
        The running proxy; call ``await proxy.stop()`` when done.

    Raises:
        As `ProxyHost.add`.
    """
    host = ProxyHost(config.client_limits)
    await host.start()
    try:
        rollout = await host.add(config, upstream)
    except BaseException:
        await host.stop()
        raise
    if config.ready_file is not None:
        write_ready_file(config.ready_file, *rollout.address)
    return RunningProxy(host, rollout)


async def start_shared(
    host: str, admin_token: str, ready_file: Path | None, admin_routes: Sequence[RouteDef] = ()
) -> ProxyHost:
    """Serve any number of rollouts, added and removed through ``/_reroll/rollouts`` with
    `admin_token`: listen on (`host`, a free port) and write the ready file (its address is that
    control site's base URL). The token opens `admin_routes` there too (`ProxyHost`).

    Raises:
        OSError: the address cannot be bound.
    """
    proxy_host = ProxyHost(ClientLimits(), admin_token, admin_routes)
    await proxy_host.start()
    try:
        _, address = await proxy_host.listen(host)
    except BaseException:
        await proxy_host.stop()
        raise
    if ready_file is not None:
        write_ready_file(ready_file, *address)
    log.info("shared proxy listening on %s", base_url_for(*address))
    return proxy_host
