"""The aiohttp front end of the proxy: one server per rollout, around a `ReplayEngine`.

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
  forward to the live upstream (streamed through event by event), or refuse with 409
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
  ``POST /_reroll/release?step=K`` lets it go on (204; 404 for a step not held). The controller
  captures a checkpoint in between.
- ``GET /healthz`` — ``{"ok": true}``, no auth.

Upstream credentials are only ever sent upstream: never to the agent, never to disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import logging
import operator
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, ProxyConfigError, TranslationError
from reroll_contracts.faults import FaultNote, ResetFault, load_plan
from reroll_contracts.proxy import (
    ClientLimits,
    ProxyConfig,
    ProxyStatus,
    ProxyStop,
    RolloutAdded,
    RolloutRegistration,
)
from reroll_contracts.service import base_url_for, write_ready_file
from reroll_contracts.trajectory import Place, Source, load_trajectory, sanitize_headers
from reroll_contracts.wire import WireFormat, all_formats, format_for_path, format_named

from reroll_proxy.asks import AskDesk
from reroll_proxy.endpoints_models import COUNT_TOKENS_PATHS, MODELS_PATHS, ModelEndpoints
from reroll_proxy.endpoints_websocket import PATHS as WEBSOCKET_PATHS
from reroll_proxy.endpoints_websocket import WebsocketRefusals
from reroll_proxy.engine import Abort, Exhausted, Replay, ReplayEngine
from reroll_proxy.faults import IN_PLACE, FaultSelector, last_message_text
from reroll_proxy.inject import Injector, recorded_payload, serve_in_place
from reroll_proxy.limits import read_body_in_time, runner_options
from reroll_proxy.recorder import Recorder
from reroll_proxy.respond import EventSource, ServedStep, UpstreamEvents, error_response, now_iso, parse_json
from reroll_proxy.retries import RetryTracker
from reroll_proxy.translate import translation_for
from reroll_proxy.volatile import Volatility

log = logging.getLogger("reroll_proxy")
SHUTDOWN_SECONDS = 0.5
"""How long stopping the proxy waits for requests in flight before cancelling them."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RolloutProxy:
    """The handlers and state of one rollout's proxy: its engine, recorder, fault plan, trial
    place and upstream session. A `ProxyHost` routes each request to one of these by the token
    it presents.

    Args:
        config: the rollout's configuration (``controller_token`` and ``upstream.api_key`` resolved).
        engine: decides replay / live / refuse per request.
        recorder: where served exchanges are appended (opened).
        faults: chooses the faults to inject (`reroll_proxy.faults`), or None.
    """

    def __init__(
        self,
        config: ProxyConfig,
        engine: ReplayEngine,
        recorder: Recorder,
        faults: FaultSelector | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.faults = faults
        self.rollout_id = secrets.token_hex(8)
        """How the host's admin endpoints name this rollout."""
        self.address: tuple[str, int] = (config.listen_host, config.listen_port)
        """The (host, port) of the site its agent reaches (set by the host once listening)."""
        self._session: aiohttp.ClientSession | None = None
        self._stopped = asyncio.Event()
        self._held: asyncio.Queue[int] = asyncio.Queue()
        """Steps held for the controller, in the order they were held."""
        self._holding: dict[int, asyncio.Event] = {}
        """Each held step's release."""
        """Set with ``engine.stop``, before the first 409 is sent (see `reroll_contracts.proxy`)."""
        self.retries = RetryTracker()
        """Tells SDK retries from new turns (`reroll_proxy.retries`)."""
        self.websockets = WebsocketRefusals()
        self.models = ModelEndpoints(
            config.upstream, engine.recorded, engine.volatility, lambda: self._session
        )
        self.place: Place | None = None
        """Where in a trial the requests are sent now (``POST /_reroll/place``)."""
        self.asks = AskDesk(lambda: self.engine.next_step, lambda: self.place)
        """The agent's ask_user questions, held until the controller answers (`reroll_proxy.asks`)."""

    @property
    def base_url(self) -> str:
        """The URL its agent uses, ``http://HOST:PORT/v1``."""
        return base_url_for(*self.address)

    async def open(self) -> None:
        """Open the client session to the upstream (none without one)."""
        upstream = self.config.upstream
        if upstream is None or self._session is not None:
            return
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=upstream.timeout_seconds, sock_read=upstream.timeout_seconds
        )
        self._session = aiohttp.ClientSession(timeout=timeout)

    async def close(self) -> None:
        """Close the upstream session, then the trajectory (after its last fsync).

        Raises:
            OSError: that fsync failed (everything is closed all the same).
        """
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        finally:
            await self.recorder.aclose()

    async def status(self, _request: web.Request) -> web.Response:
        """``GET /_reroll/status``: a `ProxyStatus`."""
        engine = self.engine
        status = ProxyStatus(
            served_replayed=engine.served_replayed,
            served_live=engine.served_live,
            cut_index=engine.cut_index,
            divergence_policy=engine.divergence_policy,
            cutover_step=engine.cutover_step,
            divergences=list(engine.divergences),
            stop=_proxy_stop(engine.stop),
            websocket_upgrades_refused=self.websockets.count,
        )
        return web.Response(body=status.model_dump_json(), content_type="application/json")

    async def wait_for_stop(self, _request: web.Request) -> web.Response:
        """``GET /_reroll/stop``: a `ProxyStop`, once there is one (a long poll)."""
        await self._stopped.wait()
        stop = _proxy_stop(self.engine.stop)
        assert stop is not None
        return web.Response(body=stop.model_dump_json(), content_type="application/json")

    async def set_place(self, request: web.Request) -> web.Response:
        """``POST /_reroll/place``: tag the exchanges from now on with the body's `Place`."""
        try:
            self.place = Place.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response({"error": f"not a place: {exc}"}, status=400)
        return web.Response(status=204)

    async def wait_for_held(self, _request: web.Request) -> web.Response:
        """``GET /_reroll/held``: ``{"step": K}`` once a request of step K is held (a long poll)."""
        return web.json_response({"step": await self._held.get()})

    async def release(self, request: web.Request) -> web.Response:
        """``POST /_reroll/release?step=K``: let the held request of step K go on."""
        held = self._holding.pop(int(request.query.get("step", "-1")), None)
        if held is None:
            return web.json_response({"error": "no request of that step is held"}, status=404)
        held.set()
        return web.Response(status=204)

    async def _hold(self, step: int) -> None:
        """Hold the request of `step` until the controller releases it (`ProxyConfig.hold_every`)."""
        every = self.config.hold_every
        if not every or step == 0 or step % every:
            return
        release = self._holding[step] = asyncio.Event()
        log.info("step %d: held for a checkpoint", step)
        self._held.put_nowait(step)
        await release.wait()

    async def serve(self, wire: WireFormat, request: web.Request) -> web.StreamResponse:
        """A model endpoint of `wire`'s format: replay, forward live, or refuse (the module docstring)."""
        received, received_at = time.monotonic(), now_iso()
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return error_response(wire, 400, "invalid_request_error", f"request body is not JSON: {exc}")
        if not isinstance(body, dict):
            return error_response(wire, 400, "invalid_request_error", "request body must be a JSON object")
        note = self._choose_fault(wire, request.path, body)
        if note is not None and isinstance(note.spec, IN_PLACE):
            source: Source = "replayed" if self.engine.replaying else "live"
            step = ServedStep(
                self.engine.inject(), wire, request, source, None, self.recorder, received, received_at
            )
            step.retry = self.retries.observe(request.headers, raw, step.number)
            step.place = self.place
            log.warning("step %d: fault %s (%s) injected", step.number, note.rule, note.spec.kind)
            try:
                return await serve_in_place(step, note, body)
            finally:
                await self.recorder.skip(step.number)
        decision = self.engine.decide(body, wire.name)
        if isinstance(decision, Exhausted):  # the cut of a replay-only rollout: a checkpoint first
            await self._hold(decision.step)
        if self.engine.stop is not None:
            self._stopped.set()  # before the 409: a status read after the agent saw it has the stop
        if isinstance(decision, Exhausted):
            log.info("step %d: replay-only, recorded responses exhausted", decision.step)
            return error_response(wire, 409, "replay_exhausted", decision.reason)
        if isinstance(decision, Abort):
            log.warning("step %d: refused, %s", decision.step, decision.reason)
            message = f"strict divergence, replay aborted: {decision.reason}\n{decision.divergence.diff}"
            return error_response(wire, 409, "replay_diverged", message)
        replay = decision if isinstance(decision, Replay) else None
        step = ServedStep(
            number=decision.step,
            wire=wire,
            request=request,
            source="replayed" if replay else "live",
            divergence=decision.divergence,
            recorder=self.recorder,
            received=received,
            received_at=received_at,
            fault=note,
            thread=decision.thread,
            replayed_from=replay.index if replay else None,
            place=self.place,
        )
        step.retry = self.retries.observe(request.headers, raw, step.number)
        if step.divergence is not None:
            then = "going live (cutover policy)" if replay is None else "serving the recording"
            log.warning("step %d: divergence, %s; %s", step.number, step.divergence.summary, then)
        try:
            if replay is None:
                await self._hold(step.number)
            return await (self._replay(step, body, replay) if replay else self._live(step, body))
        finally:
            await self.recorder.skip(step.number)

    def _choose_fault(self, wire: WireFormat, path: str, body: dict[str, Any]) -> FaultNote | None:
        if self.faults is None:
            return None
        last = last_message_text(wire, body)
        return self.faults.choose(self.engine.next_step, path, last)

    async def _replay(self, step: ServedStep, body: dict[str, Any], replay: Replay) -> web.StreamResponse:
        recorded = replay.exchange.response
        model = replay.exchange.metadata.model or _model_of(recorded.body)
        log.debug("step %d: replayed", step.number)
        factor = 1.0
        if step.fault is None and (recorded_fault := replay.exchange.metadata.fault) is not None:
            step.fault = recorded_fault.model_copy(update={"replayed": True})
            factor = self.config.replay_timing_factor
            if isinstance(recorded_fault.spec, ResetFault):
                return await serve_in_place(step, step.fault, body)
        faults = Injector(step, factor)
        try:
            await faults.delay()
            status, headers = recorded.status_code, recorded.headers
            if body.get("stream") is True and status < 400 and not isinstance(recorded.body, str):
                events, offsets = recorded.events, recorded.event_offsets_ms
                if events is None:
                    events = step.wire.to_events(
                        recorded.body if isinstance(recorded.body, dict) else {}, body
                    )
                source = faults.events(EventSource(events, offsets, self.config.replay_timing_factor))
                return await step.send_stream(status, headers, source, body, model)
            payload = recorded_payload(recorded.body)
            return await faults.deliver(await step.send_json(status, headers, payload, body, model))
        finally:
            if faults.broken and step.fault is not None and not step.fault.replayed:
                self.engine.serve_again(replay)  # a plan's fault broke it: the agent's retry gets it again

    async def _live(self, step: ServedStep, body: dict[str, Any]) -> web.StreamResponse:
        upstream = self.config.upstream
        assert upstream is not None and self._session is not None, "live needs an upstream"
        sent = {**body, "model": upstream.model} if upstream.model else body
        try:
            translation = translation_for(step.wire, upstream.api_format)
            forwarded, step.translation_notes = (
                translation.request_with_notes(sent) if translation else (sent, [])
            )
        except TranslationError as exc:
            return error_response(step.wire, 400, "invalid_request_error", str(exc))
        upstream_wire = translation.upstream if translation else step.wire
        step.upstream_format = upstream_wire.name if translation else None
        if translation is not None:
            step.translation_notes += translation.dropped(sent, step.request.headers)
        url = upstream.base_url.rstrip("/") + upstream_wire.upstream_path
        if translation is None and step.request.query_string:
            url += "?" + step.request.query_string  # e.g. ?beta=true: the provider sees what the agent sent
        log.debug("step %d: live, %s model %s", step.number, url, sent.get("model"))
        faults = Injector(step)
        await faults.delay()
        headers = upstream_wire.upstream_headers(upstream.api_key, step.request.headers)
        try:
            response = await self._session.post(
                url, data=orjson.dumps(forwarded), headers=headers | {"Content-Type": "application/json"}
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            return await self._unreachable(step, sent, f"upstream {url} unreachable: {exc!r}")
        async with response:
            headers = sanitize_headers(response.headers.items())
            if response.content_type == "text/event-stream":
                source: EventSource = UpstreamEvents(response)
                source = translation.events(source, sent) if translation else source
                source = faults.events(source)
                return await step.send_stream(response.status, headers, source, sent, sent.get("model"))
            try:
                payload = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                return await self._unreachable(step, sent, f"upstream {url} broke off: {exc!r}")
        payload = translation.response_payload(response.status, payload) if translation else payload
        model = _model_of(parse_json(payload)) or sent.get("model")
        return await faults.deliver(await step.send_json(response.status, headers, payload, sent, model))

    async def _unreachable(self, step: ServedStep, sent: dict[str, Any], error: str) -> web.StreamResponse:
        log.error("step %d: %s", step.number, error)
        payload = step.wire.error_body("upstream_error", error)
        return await step.send_json(502, {}, payload, sent, sent.get("model"), error=error)


CONTROLLER_PREFIX = "/_reroll/"
"""Routes under this prefix are the controller's: only `ProxyConfig.controller_token` opens them."""
ADMIN_PREFIX = "/_reroll/rollouts"
"""Routes under this prefix are the host's: only its admin token opens them."""


class ProxyHost:
    """One aiohttp server for any number of rollouts, each a `RolloutProxy` found by the token
    its request presents (``Authorization: Bearer``, ``x-api-key``, ``api-key``).

    Each rollout listens on a site (host, port) of its own, and its tokens open nothing elsewhere:
    the rollout token opens its model endpoints, the controller token its ``/_reroll/status``,
    ``stop`` and ``place``; the admin token opens ``/_reroll/rollouts`` (add: ``POST`` a
    `reroll_contracts.proxy.RolloutRegistration`, answered with a `RolloutAdded`; remove:
    ``DELETE /_reroll/rollouts/{rollout_id}``). Tokens are looked up by their SHA-256 digest, so
    the time a lookup takes tells nothing of a token's characters. A rollout whose recording or
    fault plan does not load is refused at ``POST`` (400, the cause in the body) and never
    affects another; a handler's exception is that request's 500.

    Args:
        limits: what one client connection is granted (`reroll_proxy.limits`).
        admin_token: opens ``/_reroll/rollouts``; None: those routes refuse every request.
    """

    def __init__(self, limits: ClientLimits, admin_token: str | None = None) -> None:
        self.limits = limits
        self._admin_token = admin_token
        self._by_token: dict[bytes, RolloutProxy] = {}
        self._by_controller: dict[bytes, RolloutProxy] = {}
        self._by_id: dict[str, RolloutProxy] = {}
        self._sites: dict[str, web.SockSite] = {}
        """Each rollout's listening site, by rollout id: its agent reaches it there and only there."""
        self.runner: web.AppRunner | None = None
        self.app = web.Application(
            middlewares=[self._authenticate, read_body_in_time(limits)],
            client_max_size=limits.max_request_bytes,
        )
        route = self.app.router

        def add(method: str, path: str, pick: Callable[[RolloutProxy], Handler]) -> None:
            route.add_route(method, path, functools.partial(_rollout_handler, pick))

        for wire in all_formats():
            for path in wire.paths:
                add("POST", path, functools.partial(_serve_as, wire))
        for path in WEBSOCKET_PATHS:
            add("GET", path, operator.attrgetter("websockets.refuse"))
        for path in COUNT_TOKENS_PATHS:
            add("POST", path, operator.attrgetter("models.count_tokens"))
        for path in MODELS_PATHS:
            add("GET", path, operator.attrgetter("models.list_models"))
            add("GET", path + "/{model_id}", operator.attrgetter("models.get_model"))
        add("GET", "/_reroll/status", operator.attrgetter("status"))
        add("GET", "/_reroll/stop", operator.attrgetter("wait_for_stop"))
        add("POST", "/_reroll/place", operator.attrgetter("set_place"))
        add("GET", "/_reroll/held", operator.attrgetter("wait_for_held"))
        add("POST", "/_reroll/release", operator.attrgetter("release"))
        add("POST", "/reroll/ask_user", operator.attrgetter("asks.ask"))  # the agent's token
        add("GET", "/_reroll/asks", operator.attrgetter("asks.pending"))
        add("POST", "/_reroll/asks/{id}", operator.attrgetter("asks.answer"))
        route.add_post(ADMIN_PREFIX, self._add_request)
        route.add_delete(ADMIN_PREFIX + "/{rollout_id}", self._remove_request)
        route.add_get("/healthz", self._health)
        self.app.on_cleanup.append(self._close_all)

    async def start(self) -> None:
        """Set up the server (it listens once a site is added)."""
        self.runner = web.AppRunner(
            self.app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=SHUTDOWN_SECONDS,
            **runner_options(self.limits),
        )
        await self.runner.setup()

    async def stop(self) -> None:
        """Stop listening, close every rollout's upstream session and trajectory."""
        if self.runner is not None:
            await self.runner.cleanup()

    async def listen(self, host: str, port: int = 0) -> tuple[web.SockSite, tuple[str, int]]:
        """Listen on a site of its own at (`host`, `port`).

        Returns:
            The site and the (host, port) it listens on (`port` 0 picks a free one).

        Raises:
            OSError: the address cannot be bound.
        """
        assert self.runner is not None, "start() first"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            site = web.SockSite(self.runner, sock)
            await site.start()
        except BaseException:
            sock.close()
            raise
        return site, (host, int(sock.getsockname()[1]))

    async def add(self, config: ProxyConfig) -> RolloutProxy:
        """Load a rollout's replay and fault plan, open its trajectory, and listen where it asks.

        Args:
            config: the rollout's configuration, ``controller_token`` and ``upstream.api_key`` resolved.

        Raises:
            FileNotFoundError: the replayed trajectory (`config.replay`) does not exist.
            TrajectoryFormatError: the replayed trajectory is corrupt (the message names file and line).
            FaultPlanError: the plan of `config.faults` is missing or invalid (named in the message).
            ProxyConfigError: nothing to serve, cut_index out of range, or a token already in use.
            OSError: the trajectory cannot be opened or the port cannot be bound.
        """
        for token in (config.token, config.controller_token):
            if token is not None and (
                _digest(token) in self._by_token or _digest(token) in self._by_controller
            ):
                raise ProxyConfigError("a rollout with this token is already served")
        engine = _engine_for(config)
        faults = (
            None
            if config.faults is None
            else FaultSelector(load_plan(config.faults.plan_path), config.faults.seed)
        )
        recorder = Recorder(config.trajectory_path, fsync=config.fsync_each_exchange)
        recorder.open()
        rollout = RolloutProxy(config, engine, recorder, faults)
        try:
            site, rollout.address = await self.listen(config.listen_host, config.listen_port)
        except BaseException:
            await recorder.aclose()
            raise
        self._sites[rollout.rollout_id] = site
        await rollout.open()
        self._by_token[_digest(config.token)] = rollout
        if config.controller_token is not None:
            self._by_controller[_digest(config.controller_token)] = rollout
        self._by_id[rollout.rollout_id] = rollout
        after = "live" if config.upstream else "stop"
        log.info(
            "rollout %s on %s: replay %d exchanges, then %s",
            rollout.rollout_id,
            rollout.base_url,
            engine.cut_index,
            after,
        )
        return rollout

    async def remove(self, rollout: RolloutProxy) -> None:
        """Stop serving `rollout`: its tokens open nothing from now on; close its trajectory.

        Raises:
            OSError: its last fsync failed (it is removed all the same).
        """
        if self._by_id.pop(rollout.rollout_id, None) is None:
            return
        self._by_token.pop(_digest(rollout.config.token), None)
        if rollout.config.controller_token is not None:
            self._by_controller.pop(_digest(rollout.config.controller_token), None)
        try:
            await rollout.close()
        finally:
            await self._sites.pop(rollout.rollout_id).stop()
        log.info("rollout %s removed", rollout.rollout_id)

    async def _close_all(self, _app: web.Application) -> None:
        for rollout in list(self._by_id.values()):
            with contextlib.suppress(OSError):
                await rollout.close()
        self._by_id.clear()

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        presented = _credentials(request)
        route = _route_path(request)
        if route.startswith(ADMIN_PREFIX):
            if self._admin_token is not None and _matches(presented, self._admin_token):
                return await handler(request)
            return web.json_response({"error": "missing or wrong admin token"}, status=401)
        if route.startswith(CONTROLLER_PREFIX):
            # Decided by the route that matched, not by how the path was spelt.
            rollout = self._find(self._by_controller, presented)
            if rollout is not None and _arrived_at(request, rollout.address):
                request["rollout"] = rollout
                return await handler(request)
            own = self._find(self._by_token, presented)
            if own is not None and _arrived_at(request, own.address):
                log.warning(
                    "refused %s %s: the rollout token does not open /_reroll/*", request.method, request.path
                )
                message = "the rollout token does not open the controller's endpoints (/_reroll/*)"
                return error_response(format_named("openai-chat"), 403, "controller_only", message)
            message = "missing or wrong controller token (Authorization: Bearer, or x-api-key)"
            return error_response(format_named("openai-chat"), 401, "invalid_api_key", message)
        rollout = self._find(self._by_token, presented)
        if rollout is not None and _arrived_at(request, rollout.address):
            request["rollout"] = rollout
            return await handler(request)
        message = "missing or wrong rollout token (Authorization: Bearer, or x-api-key)"
        wire = format_for_path(request.path) or format_named("openai-chat")
        return error_response(wire, 401, "invalid_api_key", message)

    @staticmethod
    def _find(table: dict[bytes, RolloutProxy], presented: list[bytes]) -> RolloutProxy | None:
        for value in presented:
            found = table.get(hashlib.sha256(value).digest())
            if found is not None:
                return found
        return None

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _add_request(self, request: web.Request) -> web.Response:
        try:
            registration = RolloutRegistration.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response({"error": f"not a rollout registration: {exc}"}, status=400)
        try:
            rollout = await self.add(registration.resolved())
        except (ConfigError, FileNotFoundError, OSError) as exc:
            log.error("refused a rollout: %s", exc)
            return web.json_response({"error": str(exc)}, status=400)
        added = RolloutAdded(rollout_id=rollout.rollout_id, base_url=rollout.base_url)
        return web.Response(body=added.model_dump_json(), content_type="application/json")

    async def _remove_request(self, request: web.Request) -> web.Response:
        rollout = self._by_id.get(request.match_info["rollout_id"])
        if rollout is None:
            return web.json_response({"error": "no such rollout"}, status=404)
        try:
            await self.remove(rollout)
        except OSError as exc:
            return web.json_response({"error": f"its trajectory's last fsync failed: {exc}"}, status=500)
        return web.Response(status=204)


def _serve_as(wire: WireFormat, rollout: RolloutProxy) -> Handler:
    """`rollout`'s handler of the model endpoint of `wire`'s format."""
    return functools.partial(rollout.serve, wire)


async def _rollout_handler(
    pick: Callable[[RolloutProxy], Handler], request: web.Request
) -> web.StreamResponse:
    """Serve `request` with the handler `pick` chooses of the rollout the middleware found."""
    return await pick(request["rollout"])(request)


def _route_path(request: web.Request) -> str:
    """The canonical path of the route `request` matched (or, unmatched, its path)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


def _arrived_at(request: web.Request, address: tuple[str, int]) -> bool:
    """Whether `request` came in on the site at `address`: a rollout's token opens its own site
    only (its port; and its address, unless it listens on every interface)."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if sockname is None:
        return False
    host, port = address
    if int(sockname[1]) != port:
        return False
    listened = _ip_address(host)
    if listened is None:  # a host name: its port decides
        return True
    return listened.is_unspecified or _ip_address(sockname[0]) == listened


@functools.lru_cache(maxsize=1024)
def _ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address (parsed once per host: it is asked on every request), None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _credentials(request: web.Request) -> list[bytes]:
    """The tokens `request` presents: ``Authorization: Bearer``, ``x-api-key``, ``api-key``."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    presented = [credential.strip()] if scheme.lower() == "bearer" else []
    presented += [request.headers.get(name, "") for name in ("x-api-key", "api-key")]
    return [value.encode() for value in presented if value]


def _matches(presented: list[bytes], expected: str) -> bool:
    """Whether one of the `presented` tokens is `expected` (each compared in constant time)."""
    wanted = expected.encode()
    return any([secrets.compare_digest(value, wanted) for value in presented])


def _proxy_stop(stop: Abort | Exhausted | None) -> ProxyStop | None:
    """The engine's first refusal as the contract's `ProxyStop`."""
    if stop is None:
        return None
    if isinstance(stop, Abort):
        return ProxyStop(kind="replay_diverged", step=stop.step, reason=stop.reason)
    return ProxyStop(kind="replay_exhausted", step=stop.step, reason=stop.reason)


def _model_of(body: Any) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


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


async def start_proxy(config: ProxyConfig) -> RunningProxy:
    """Serve one rollout: load the replay, open the trajectory, listen, and write the ready file
    (if configured).

    Args:
        config: the proxy's configuration.

    Returns:
        The running proxy; call ``await proxy.stop()`` when done.

    Raises:
        As `ProxyHost.add`.
    """
    host = ProxyHost(config.client_limits)
    await host.start()
    try:
        rollout = await host.add(config)
    except BaseException:
        await host.stop()
        raise
    if config.ready_file is not None:
        write_ready_file(config.ready_file, *rollout.address)
    return RunningProxy(host, rollout)


async def start_shared(host: str, admin_token: str, ready_file: Path | None) -> ProxyHost:
    """Serve any number of rollouts, added and removed through ``/_reroll/rollouts`` with
    `admin_token`: listen on (`host`, a free port) and write the ready file (its address is that
    control site's base URL).

    Raises:
        OSError: the address cannot be bound.
    """
    proxy_host = ProxyHost(ClientLimits(), admin_token)
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


def _engine_for(config: ProxyConfig) -> ReplayEngine:
    replay = config.replay
    if replay is None and config.upstream is None:
        raise ProxyConfigError("nothing to serve: the config has neither replay nor upstream")
    if replay is None:
        return ReplayEngine([], 0, True, volatility=Volatility(config.volatile))
    loaded = load_trajectory(replay.trajectory_path)
    if loaded.warning:
        log.warning("%s", loaded.warning)
    recorded = loaded.exchanges
    cut_index = len(recorded) if replay.cut_index is None else replay.cut_index
    if cut_index > len(recorded):
        raise ProxyConfigError(
            f"cut_index {cut_index} exceeds the {len(recorded)} exchanges in {replay.trajectory_path}"
        )
    return ReplayEngine(
        recorded,
        cut_index,
        config.upstream is not None,
        replay.divergence_policy,
        Volatility(config.volatile),
    )
