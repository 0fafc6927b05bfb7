"""One rollout's proxy: its engine, recorder, fault plan, trial place and `Upstream`, and the
handlers of its routes (the model endpoints and the controller's ``/_reroll/*``; see
`reroll_proxy.server` for the routes). A `reroll_proxy.host.ProxyHost` routes each request to
one of these by the token it presents.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

import orjson
from pydantic import ValidationError
from reroll_contracts.btrfs import freeze
from reroll_contracts.faults import FaultNote
from reroll_contracts.proxy import FreezePlan, HeldStep, ProxyConfig, ProxyStatus, ProxyStop
from reroll_contracts.service import base_url_for
from reroll_contracts.trajectory import Place, Source
from reroll_contracts.wire import WireFormat

from reroll_proxy.asks import AskDesk
from reroll_proxy.endpoints_models import ModelEndpoints
from reroll_proxy.endpoints_websocket import WebsocketRefusals
from reroll_proxy.engine import Abort, Exhausted, Replay, ReplayEngine, StepLimited, Stop
from reroll_proxy.faults import IN_PLACE, FaultSelector, last_message_text
from reroll_proxy.inject import serve_in_place
from reroll_proxy.live import serve_live
from reroll_proxy.messages import Request, Response, StreamResponse, json_response
from reroll_proxy.recorder import Recorder
from reroll_proxy.replayed import serve_replayed
from reroll_proxy.respond import ServedStep, error_response, now_iso
from reroll_proxy.retries import RetryTracker
from reroll_proxy.upstream import Http1Upstream, Upstream

log = logging.getLogger("reroll_proxy")


class RolloutProxy:
    """The handlers and state of one rollout's proxy: its engine, recorder, fault plan, trial
    place and upstream session. A `ProxyHost` routes each request to one of these by the token
    it presents.

    Args:
        config: the rollout's configuration (``controller_token`` and ``upstream.api_key`` resolved).
        engine: decides replay / live / refuse per request.
        recorder: where served exchanges are appended (opened).
        faults: chooses the faults to inject (`reroll_proxy.faults`), or None.
        upstream: where live requests go; None: an `Http1Upstream` when the config has an
            upstream (none without one).
    """

    def __init__(
        self,
        config: ProxyConfig,
        engine: ReplayEngine,
        recorder: Recorder,
        faults: FaultSelector | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.recorder = recorder
        self.faults = faults
        self.rollout_id = secrets.token_hex(8)
        """How the host's admin endpoints name this rollout."""
        self.address: tuple[str, int] = (config.listen_host, config.listen_port)
        """The (host, port) of the site its agent reaches (set by the host once listening)."""
        if upstream is None and config.upstream is not None:
            upstream = Http1Upstream(config.upstream.timeout_seconds)
        self.upstream = upstream
        """Where live requests go (None: replay only)."""
        self._stopped = asyncio.Event()
        """Set with ``engine.stop``, before the first 409 is sent (see `reroll_contracts.proxy`)."""
        self._held: asyncio.Queue[HeldStep] = asyncio.Queue()
        """Steps held (or frozen) for the controller, in the order they were."""
        self._holding: dict[int, tuple[asyncio.Event, float]] = {}
        """Each held step's release and when it was held (`time.monotonic`)."""
        self.freeze_plan: FreezePlan | None = None
        """Freeze the sandbox at each step to hold instead of holding it (``POST /_reroll/freeze``)."""
        self.retries = RetryTracker()
        """Tells SDK retries from new turns (`reroll_proxy.retries`)."""
        self.websockets = WebsocketRefusals()
        self.models = ModelEndpoints(
            config.upstream, engine.recorded, engine.volatility, lambda: self.upstream
        )
        self.place: Place | None = None
        """Where in a trial the requests are sent now (``POST /_reroll/place``)."""
        self.asks = AskDesk(lambda: self.engine.next_step, lambda: self.place)
        """The agent's ask_user questions, held until the controller answers (`reroll_proxy.asks`)."""

    @property
    def base_url(self) -> str:
        """The URL its agent uses, ``http://HOST:PORT/v1``."""
        return base_url_for(*self.address)

    async def close(self) -> None:
        """Close the upstream's connections, then the trajectory (after its last fsync).

        Raises:
            OSError: that fsync failed (everything is closed all the same).
        """
        upstream, self.upstream = self.upstream, None
        try:
            if upstream is not None:
                await upstream.aclose()
        finally:
            await self.recorder.aclose()

    async def status(self, _request: Request) -> Response:
        """``GET /_reroll/status``: a `ProxyStatus`."""
        engine = self.engine
        status = ProxyStatus(
            served_replayed=engine.served_replayed,
            served_live=engine.served_live,
            cut_index=engine.cut_index,
            divergence_policy=engine.divergence_policy,
            cutover_step=engine.cutover_step,
            divergences=list(engine.divergences),
            stop=proxy_stop(engine.stop),
            websocket_upgrades_refused=self.websockets.count,
        )
        return Response(body=status.model_dump_json(), content_type="application/json")

    async def wait_for_stop(self, _request: Request) -> Response:
        """``GET /_reroll/stop``: a `ProxyStop`, once there is one (a long poll)."""
        await self._stopped.wait()
        stop = proxy_stop(self.engine.stop)
        assert stop is not None
        return Response(body=stop.model_dump_json(), content_type="application/json")

    async def set_place(self, request: Request) -> Response:
        """``POST /_reroll/place``: tag the exchanges from now on with the body's `Place`."""
        try:
            self.place = Place.model_validate_json(await request.read())
        except ValidationError as exc:
            return json_response({"error": f"not a place: {exc}"}, status=400)
        return Response(status=204)

    async def wait_for_held(self, _request: Request) -> Response:
        """``GET /_reroll/held``: a `HeldStep` once a request of step K is held or was frozen (a
        long poll)."""
        held = await self._held.get()
        return Response(body=held.model_dump_json(), content_type="application/json")

    async def set_freeze(self, request: Request) -> Response:
        """``POST /_reroll/freeze``: from now on, take the body's `FreezePlan` snapshot at each step
        to hold instead of holding the request (204; 400 for a body that is not a plan)."""
        try:
            self.freeze_plan = FreezePlan.model_validate_json(await request.read())
        except ValidationError as exc:
            return json_response({"error": f"not a freeze plan: {exc}"}, status=400)
        return Response(status=204)

    async def release(self, request: Request) -> Response:
        """``POST /_reroll/release?step=K``: let the held request of step K go on; answers
        ``{"held_seconds": s}``, how long it was held (from `_hold` to this release: the wait the
        agent saw, the controller's round trips included)."""
        held = self._holding.pop(int(request.query.get("step", "-1")), None)
        if held is None:
            return json_response({"error": "no request of that step is held"}, status=404)
        release, since = held
        release.set()
        return json_response({"held_seconds": round(time.monotonic() - since, 6)})

    async def _hold(self, step: int) -> None:
        """Hold the request of `step` until the controller releases it (`ProxyConfig.hold_every`),
        or with a `freeze_plan` only while the snapshot is taken (`_freeze`)."""
        every = self.config.hold_every
        if not every or step == 0 or step % every:
            return
        if self.freeze_plan is not None:
            await self._freeze(step, self.freeze_plan)
            return
        release = asyncio.Event()
        self._holding[step] = (release, time.monotonic())
        log.info("step %d: held for a checkpoint", step)
        self._held.put_nowait(HeldStep(step=step))
        await release.wait()

    async def _freeze(self, step: int, plan: FreezePlan) -> None:
        """Take step `step`'s snapshot of `plan` (`reroll_contracts.btrfs.freeze`, in a thread:
        the ioctls block) and tell the controller (`HeldStep`, ``frozen``); a failure is told,
        and the request goes on all the same."""
        began, error = time.monotonic(), None
        try:
            await asyncio.to_thread(freeze, plan.step_folder(step), plan.sources, plan.paths, plan.root)
        except OSError as exc:
            error = str(exc)
            log.warning("step %d: freezing the sandbox failed: %s", step, exc)
        held = round(time.monotonic() - began, 6)
        self._held.put_nowait(HeldStep(step=step, frozen=True, held_seconds=held, error=error))

    async def serve(self, wire: WireFormat, request: Request) -> StreamResponse:
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
        decision = self.engine.decide(body, wire.name, later=True)
        if isinstance(decision, Exhausted | StepLimited):  # the end of a replay-only rollout or
            await self._hold(decision.step)  # of the step limit: a checkpoint first
        if self.engine.stop is not None:
            self._stopped.set()  # before the 409: a status read after the agent saw it has the stop
        if isinstance(decision, Exhausted):
            log.info("step %d: replay-only, recorded responses exhausted", decision.step)
            return error_response(wire, 409, "replay_exhausted", decision.reason)
        if isinstance(decision, StepLimited):
            log.info("step %d: refused, %s", decision.step, decision.reason)
            return error_response(wire, 409, "step_limit", decision.reason)
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
        if decision.thread is None:  # worked out while the upstream answers (`serve_live`)
            step.threads = self.engine
        step.retry = self.retries.observe(request.headers, raw, step.number)
        if step.divergence is not None:
            then = "going live (cutover policy)" if replay is None else "serving the recording"
            log.warning("step %d: divergence, %s; %s", step.number, step.divergence.summary, then)
        try:
            if replay is None:
                await self._hold(step.number)
            if replay is not None:
                factor = self.config.replay_timing_factor
                return await serve_replayed(step, body, replay, self.engine, factor)
            return await self._live(step, body)
        finally:
            await self.recorder.skip(step.number)

    def _choose_fault(self, wire: WireFormat, path: str, body: dict[str, Any]) -> FaultNote | None:
        if self.faults is None or self.engine.limited:  # past the step limit: refused, not faulted
            return None
        last = last_message_text(wire, body)
        return self.faults.choose(self.engine.next_step, path, last)

    async def _live(self, step: ServedStep, body: dict[str, Any]) -> StreamResponse:
        assert self.config.upstream is not None and self.upstream is not None, "live needs an upstream"
        return await serve_live(step, body, self.config.upstream, self.upstream)


def proxy_stop(stop: Stop | None) -> ProxyStop | None:
    """The engine's first refusal as the contract's `ProxyStop`."""
    if stop is None:
        return None
    if isinstance(stop, Abort):
        return ProxyStop(kind="replay_diverged", step=stop.step, reason=stop.reason)
    if isinstance(stop, StepLimited):
        return ProxyStop(kind="step_limit", step=stop.step, reason=stop.reason)
    return ProxyStop(kind="replay_exhausted", step=stop.step, reason=stop.reason)
