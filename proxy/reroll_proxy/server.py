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
- ``GET /_reroll/held`` — a long poll: answers ``{"step": K}`` once a live request of step K
  (a positive multiple of ``hold_every``), or one past a replay-only cut, is held, unanswered;
  ``POST /_reroll/release?step=K`` lets it go on (204; 404 for a step not held). The controller
  captures a checkpoint in between.
- ``GET /healthz`` — ``{"ok": true}``, no auth.

Upstream credentials are only ever sent upstream: never to the agent, never to disk.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError
from reroll_contracts.errors import ProxyConfigError, TranslationError
from reroll_contracts.faults import FaultNote, ResetFault, load_plan
from reroll_contracts.proxy import ProxyConfig, ProxyStatus, ProxyStop
from reroll_contracts.trajectory import Place, Source, load_trajectory, sanitize_headers

from reroll_proxy.endpoints_models import ModelEndpoints
from reroll_proxy.endpoints_websocket import PATHS as WEBSOCKET_PATHS
from reroll_proxy.endpoints_websocket import WebsocketRefusals
from reroll_proxy.engine import Abort, Exhausted, Replay, ReplayEngine
from reroll_proxy.faults import IN_PLACE, FaultSelector, last_message_text
from reroll_proxy.formats import WireFormat, all_formats, format_for_path, format_named
from reroll_proxy.inject import Injector, recorded_payload, serve_in_place
from reroll_proxy.limits import read_body_in_time, runner_options
from reroll_proxy.recorder import Recorder
from reroll_proxy.respond import EventSource, ServedStep, UpstreamEvents, error_response, now_iso, parse_json
from reroll_proxy.retries import RetryTracker
from reroll_proxy.runtime import base_url_for, write_ready_file
from reroll_proxy.translate import translation_for
from reroll_proxy.volatile import Volatility

log = logging.getLogger("reroll_proxy")
SHUTDOWN_SECONDS = 0.5
"""How long stopping the proxy waits for requests in flight before cancelling them."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ProxyServer:
    """The request handlers of one proxy.

    Args:
        config: the proxy's configuration.
        engine: decides replay / live / refuse per request.
        recorder: where served exchanges are appended.
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
        self._session: aiohttp.ClientSession | None = None
        self._stopped = asyncio.Event()
        self._held: asyncio.Queue[int] = asyncio.Queue()
        """Steps held for the controller, in the order they were held."""
        self._holding: dict[int, asyncio.Event] = {}
        """Each held step's release."""
        """Set with ``engine.stop``, before the first 409 is sent (see `reroll_contracts.proxy`)."""
        limits = config.client_limits
        self.app = web.Application(
            middlewares=[self._authenticate, read_body_in_time(limits)],
            client_max_size=limits.max_request_bytes,
        )
        for wire in all_formats():
            for path in wire.paths:
                self.app.router.add_post(path, functools.partial(self._serve, wire))
        self.retries = RetryTracker()
        """Tells SDK retries from new turns (`reroll_proxy.retries`)."""
        self.websockets = WebsocketRefusals()
        for path in WEBSOCKET_PATHS:
            self.app.router.add_get(path, self.websockets.refuse)
        models = ModelEndpoints(config.upstream, engine.recorded, engine.volatility, lambda: self._session)
        models.add_routes(self.app)
        self.app.router.add_get("/_reroll/status", self._status)
        self.app.router.add_get("/_reroll/stop", self._wait_for_stop)
        self.app.router.add_post("/_reroll/place", self._set_place)
        self.app.router.add_get("/_reroll/held", self._wait_for_held)
        self.app.router.add_post("/_reroll/release", self._release)
        self.place: Place | None = None
        """Where in a trial the requests are sent now (``POST /_reroll/place``)."""
        self.app.router.add_get("/healthz", self._health)
        self.app.cleanup_ctx.append(self._client_session)
        self.app.on_cleanup.append(self._close_recorder)

    async def _client_session(self, _app: web.Application) -> AsyncIterator[None]:
        upstream = self.config.upstream
        if upstream is None:
            yield
            return
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=upstream.timeout_seconds, sock_read=upstream.timeout_seconds
        )
        async with aiohttp.ClientSession(timeout=timeout) as self._session:
            yield
        self._session = None

    async def _close_recorder(self, _app: web.Application) -> None:
        await self.recorder.aclose()

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        presented = _credentials(request)
        if _controller_route(request):
            # Decided by the route that matched, not by how the path was spelt.
            if self.config.controller_token is not None and _matches(presented, self.config.controller_token):
                return await handler(request)
            if _matches(presented, self.config.token):
                log.warning(
                    "refused %s %s: the rollout token does not open /_reroll/*", request.method, request.path
                )
                message = "the rollout token does not open the controller's endpoints (/_reroll/*)"
                return error_response(format_named("openai-chat"), 403, "controller_only", message)
            message = "missing or wrong controller token (Authorization: Bearer, or x-api-key)"
            return error_response(format_named("openai-chat"), 401, "invalid_api_key", message)
        if _matches(presented, self.config.token):
            return await handler(request)
        message = "missing or wrong rollout token (Authorization: Bearer, or x-api-key)"
        wire = format_for_path(request.path) or format_named("openai-chat")
        return error_response(wire, 401, "invalid_api_key", message)

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _status(self, _request: web.Request) -> web.Response:
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

    async def _wait_for_stop(self, _request: web.Request) -> web.Response:
        await self._stopped.wait()
        stop = _proxy_stop(self.engine.stop)
        assert stop is not None
        return web.Response(body=stop.model_dump_json(), content_type="application/json")

    async def _set_place(self, request: web.Request) -> web.Response:
        try:
            self.place = Place.model_validate_json(await request.read())
        except ValidationError as exc:
            return web.json_response({"error": f"not a place: {exc}"}, status=400)
        return web.Response(status=204)

    async def _wait_for_held(self, _request: web.Request) -> web.Response:
        return web.json_response({"step": await self._held.get()})

    async def _release(self, request: web.Request) -> web.Response:
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

    async def _serve(self, wire: WireFormat, request: web.Request) -> web.StreamResponse:
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
        log.info("step %d: replayed", step.number)
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
        log.info("step %d: live, %s model %s", step.number, url, sent.get("model"))
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


def _controller_route(request: web.Request) -> bool:
    """Whether the route `request` matched is one of the controller's (or, unmatched, its path is)."""
    resource = request.match_info.route.resource
    path = resource.canonical if resource is not None else request.path
    return path.startswith(CONTROLLER_PREFIX)


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
    """A proxy listening in this process (from `start_proxy`)."""

    def __init__(self, runner: web.AppRunner, server: ProxyServer, host: str, port: int) -> None:
        self._runner = runner
        self.server = server
        """The handlers; ``server.engine`` holds the counters."""
        self.host = host
        self.port = port
        """The TCP port it listens on."""

    @property
    def base_url(self) -> str:
        """The URL to give the agent, ``http://HOST:PORT/v1``."""
        return base_url_for(self.host, self.port)

    async def stop(self) -> None:
        """Stop listening, close the upstream session and the trajectory file."""
        await self._runner.cleanup()


async def start_proxy(config: ProxyConfig) -> RunningProxy:
    """Load the replay, open the trajectory, listen, and write the ready file (if configured).

    Args:
        config: the proxy's configuration.

    Returns:
        The running proxy; call ``await proxy.stop()`` when done.

    Raises:
        FileNotFoundError: the replayed trajectory (`config.replay`) does not exist.
        TrajectoryFormatError: the replayed trajectory is corrupt (the message names file and line).
        FaultPlanError: the plan of `config.faults` is missing or invalid (named in the message).
        ProxyConfigError: nothing to serve (neither replay nor upstream), or cut_index is out of range.
        OSError: the trajectory cannot be opened or the port cannot be bound.
    """
    engine = _engine_for(config)
    faults = (
        None
        if config.faults is None
        else FaultSelector(load_plan(config.faults.plan_path), config.faults.seed)
    )
    recorder = Recorder(config.trajectory_path, fsync=config.fsync_each_exchange)
    recorder.open()
    server = ProxyServer(config, engine, recorder, faults)
    # An agent that hangs up (killed at its timeout) cancels its request: the response it never
    # received is not recorded. Shutdown does not wait for requests still in flight.
    runner = web.AppRunner(
        server.app,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_SECONDS,
        **runner_options(config.client_limits),
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.listen_host, config.listen_port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    port = int(runner.addresses[0][1])
    if config.ready_file is not None:
        write_ready_file(config.ready_file, config.listen_host, port)
    proxy = RunningProxy(runner, server, config.listen_host, port)
    after = "live" if config.upstream else "stop"
    log.info("listening on %s: replay %d exchanges, then %s", proxy.base_url, engine.cut_index, after)
    return proxy


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
