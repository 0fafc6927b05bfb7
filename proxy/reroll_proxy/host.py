"""One HTTP server for any number of rollouts (`ProxyHost`): its routes, the authentication
in front of them, and the admin endpoints that add and remove rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import operator
import socket
from collections.abc import Awaitable, Callable, Sequence

from pydantic import ValidationError
from reroll_contracts.errors import ConfigError, ProxyConfigError
from reroll_contracts.faults import load_plan
from reroll_contracts.proxy import ClientLimits, ProxyConfig, RolloutAdded, RolloutRegistration
from reroll_contracts.trajectory import load_trajectory
from reroll_contracts.wire import WireFormat, all_formats, format_for_path, format_named

from reroll_proxy.auth import arrived_at, credentials, digest, matches
from reroll_proxy.endpoints_models import COUNT_TOKENS_PATHS, MODELS_PATHS
from reroll_proxy.endpoints_websocket import PATHS as WEBSOCKET_PATHS
from reroll_proxy.engine import ReplayEngine
from reroll_proxy.faults import FaultSelector
from reroll_proxy.front import Handler, RouteDef, Router, Server
from reroll_proxy.messages import Request, Response, StreamResponse, json_response
from reroll_proxy.recorder import Recorder
from reroll_proxy.respond import error_response
from reroll_proxy.rollout import RolloutProxy
from reroll_proxy.upstream import Upstream
from reroll_proxy.volatile import Volatility

log = logging.getLogger("reroll_proxy")
Route = Callable[[Request, RolloutProxy], Awaitable[StreamResponse]]
"""A route's target: a request and the rollout whose token opened it (the host's own routes
ignore it)."""


CONTROLLER_PREFIX = "/_reroll/"
"""Routes under this prefix are the controller's: only `ProxyConfig.controller_token` opens them."""
ADMIN_PREFIX = "/_reroll/rollouts"
"""Routes under this prefix are the host's: only its admin token opens them."""


class ProxyHost:
    """One HTTP server (`reroll_proxy.front`) for any number of rollouts, each a `RolloutProxy`
    found by the token its request presents (``Authorization: Bearer``, ``x-api-key``, ``api-key``).

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
        admin_token: opens ``/_reroll/rollouts`` and `admin_routes`; None: they refuse every request.
        admin_routes: more routes of the host's, under `CONTROLLER_PREFIX`, that the admin token
            opens (the shared scripted model's, `reroll_proxy.scripted.SharedScripts.admin_routes`).
    """

    def __init__(
        self, limits: ClientLimits, admin_token: str | None = None, admin_routes: Sequence[RouteDef] = ()
    ) -> None:
        self.limits = limits
        self._admin_token = admin_token
        self._admin_paths = (ADMIN_PREFIX, *(path for _, path, _ in admin_routes))
        """Where the admin token, and it only, opens a route (each a prefix of the routes' paths)."""
        self._by_token: dict[bytes, RolloutProxy] = {}
        self._by_controller: dict[bytes, RolloutProxy] = {}
        self._by_id: dict[str, RolloutProxy] = {}
        self._sites: dict[str, asyncio.Server] = {}
        """Each rollout's listening site, by rollout id: its agent reaches it there and only there."""
        self._listening: list[asyncio.Server] = []
        self.server = Server(self._dispatch, limits)
        self._routes: Router[Route] = Router()

        def add(method: str, path: str, pick: Callable[[RolloutProxy], Handler]) -> None:
            self._routes.add(method, path, functools.partial(_rollout_handler, pick))

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
        add("POST", "/_reroll/freeze", operator.attrgetter("set_freeze"))
        add("POST", "/reroll/ask_user", operator.attrgetter("asks.ask"))  # the agent's token
        add("GET", "/_reroll/asks", operator.attrgetter("asks.pending"))
        add("POST", "/_reroll/asks/{id}", operator.attrgetter("asks.answer"))
        self._routes.add("POST", ADMIN_PREFIX, _host_route(self._add_request))
        self._routes.add("DELETE", ADMIN_PREFIX + "/{rollout_id}", _host_route(self._remove_request))
        for method, path, handler in admin_routes:
            self._routes.add(method, path, _host_route(handler))

    async def start(self) -> None:
        """Nothing to set up before the first site (kept for the callers' start / stop pairing)."""

    async def stop(self) -> None:
        """Stop listening, end the requests in flight (`reroll_proxy.front.Server.shutdown`),
        close every rollout's upstream session and trajectory."""
        for site in self._listening:
            site.close()
        self._listening.clear()
        await self.server.shutdown()
        for rollout in list(self._by_id.values()):
            with contextlib.suppress(OSError):
                await rollout.close()
        self._by_id.clear()

    async def listen(self, host: str, port: int = 0) -> tuple[asyncio.Server, tuple[str, int]]:
        """Listen on a site of its own at (`host`, `port`).

        Returns:
            The site and the (host, port) it listens on (`port` 0 picks a free one).

        Raises:
            OSError: the address cannot be bound.
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            site = await self.server.listen(sock)
        except BaseException:
            sock.close()
            raise
        self._listening.append(site)
        return site, (host, int(sock.getsockname()[1]))

    async def add(self, config: ProxyConfig, upstream: Upstream | None = None) -> RolloutProxy:
        """Load a rollout's replay and fault plan, open its trajectory, and listen where it asks.

        Args:
            config: the rollout's configuration, ``controller_token`` and ``upstream.api_key`` resolved.
            upstream: where its live requests go; None: over HTTP to ``config.upstream``.

        Raises:
            FileNotFoundError: the replayed trajectory (`config.replay`) does not exist.
            TrajectoryFormatError: the replayed trajectory is corrupt (the message names file and line).
            FaultPlanError: the plan of `config.faults` is missing or invalid (named in the message).
            ProxyConfigError: nothing to serve, cut_index out of range, or a token already in use.
            OSError: the trajectory cannot be opened or the port cannot be bound.
        """
        for token in (config.token, config.controller_token):
            if token is not None and (
                digest(token) in self._by_token or digest(token) in self._by_controller
            ):
                raise ProxyConfigError("a rollout with this token is already served")
        engine = engine_for(config)
        faults = (
            None
            if config.faults is None
            else FaultSelector(load_plan(config.faults.plan_path), config.faults.seed)
        )
        recorder = Recorder(config.trajectory_path, fsync=config.fsync_each_exchange)
        recorder.open()
        rollout = RolloutProxy(config, engine, recorder, faults, upstream)
        try:
            site, rollout.address = await self.listen(config.listen_host, config.listen_port)
        except BaseException:
            await recorder.aclose()
            raise
        self._sites[rollout.rollout_id] = site
        self._by_token[digest(config.token)] = rollout
        if config.controller_token is not None:
            self._by_controller[digest(config.controller_token)] = rollout
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
        self._by_token.pop(digest(rollout.config.token), None)
        if rollout.config.controller_token is not None:
            self._by_controller.pop(digest(rollout.config.controller_token), None)
        try:
            await rollout.close()
        finally:
            site = self._sites.pop(rollout.rollout_id)
            site.close()
            self._listening.remove(site)
        log.info("rollout %s removed", rollout.rollout_id)

    async def _dispatch(self, request: Request) -> StreamResponse:
        """Route `request`, authenticate it by the route it matched, and answer it."""
        if request.path == "/healthz":
            return json_response({"ok": True})
        route, target = self._routes.resolve(request)
        presented = credentials(request)
        path = route or request.path  # decided by the route that matched, not by how the path was spelt
        rollout: RolloutProxy | None = None
        if path.startswith(self._admin_paths):
            if self._admin_token is None or not matches(presented, self._admin_token):
                return json_response({"error": "missing or wrong admin token"}, status=401)
        elif path.startswith(CONTROLLER_PREFIX):
            rollout = self._find(self._by_controller, presented)
            if rollout is None or not arrived_at(request, rollout.address):
                return self._refuse_controller(request, presented)
        else:
            rollout = self._find(self._by_token, presented)
            if rollout is None or not arrived_at(request, rollout.address):
                message = "missing or wrong rollout token (Authorization: Bearer, or x-api-key)"
                wire = format_for_path(request.path) or format_named("openai-chat")
                return error_response(wire, 401, "invalid_api_key", message)
        if target is None:
            status = 404 if route is None else 405
            return json_response({"error": f"no route {request.method} {request.path}"}, status=status)
        return await target(request, rollout)  # type: ignore[arg-type]  # None for the host's own

    def _refuse_controller(self, request: Request, presented: list[bytes]) -> Response:
        """401, or 403 for the rollout's own token, on a controller route."""
        own = self._find(self._by_token, presented)
        if own is not None and arrived_at(request, own.address):
            log.warning(
                "refused %s %s: the rollout token does not open /_reroll/*", request.method, request.path
            )
            message = "the rollout token does not open the controller's endpoints (/_reroll/*)"
            return error_response(format_named("openai-chat"), 403, "controller_only", message)
        message = "missing or wrong controller token (Authorization: Bearer, or x-api-key)"
        return error_response(format_named("openai-chat"), 401, "invalid_api_key", message)

    @staticmethod
    def _find(table: dict[bytes, RolloutProxy], presented: list[bytes]) -> RolloutProxy | None:
        for value in presented:
            found = table.get(hashlib.sha256(value).digest())
            if found is not None:
                return found
        return None

    async def _add_request(self, request: Request) -> Response:
        try:
            registration = RolloutRegistration.model_validate_json(await request.read())
        except ValidationError as exc:
            return json_response({"error": f"not a rollout registration: {exc}"}, status=400)
        try:
            rollout = await self.add(registration.resolved())
        except (ConfigError, FileNotFoundError, OSError) as exc:
            log.error("refused a rollout: %s", exc)
            return json_response({"error": str(exc)}, status=400)
        added = RolloutAdded(rollout_id=rollout.rollout_id, base_url=rollout.base_url)
        return Response(body=added.model_dump_json(), content_type="application/json")

    async def _remove_request(self, request: Request) -> Response:
        rollout = self._by_id.get(request.match_info["rollout_id"])
        if rollout is None:
            return json_response({"error": "no such rollout"}, status=404)
        try:
            await self.remove(rollout)
        except OSError as exc:
            return json_response({"error": f"its trajectory's last fsync failed: {exc}"}, status=500)
        return Response(status=204)


def _serve_as(wire: WireFormat, rollout: RolloutProxy) -> Handler:
    """`rollout`'s handler of the model endpoint of `wire`'s format."""
    return functools.partial(rollout.serve, wire)


async def _rollout_handler(
    pick: Callable[[RolloutProxy], Handler], request: Request, rollout: RolloutProxy
) -> StreamResponse:
    """Serve `request` with the handler `pick` chooses of the rollout its token opened."""
    return await pick(rollout)(request)


def _host_route(handler: Handler) -> Route:
    """`handler` as a route's target (the host's own: no rollout)."""

    async def route(request: Request, _rollout: RolloutProxy) -> StreamResponse:
        return await handler(request)

    return route


def engine_for(config: ProxyConfig) -> ReplayEngine:
    """The engine of a rollout: its replay loaded (if any), live after the cut if it has an upstream.

    Raises:
        FileNotFoundError: the replayed trajectory does not exist.
        TrajectoryFormatError: the replayed trajectory is corrupt.
        ProxyConfigError: nothing to serve, or cut_index out of range.
    """
    replay = config.replay
    if replay is None and config.upstream is None:
        raise ProxyConfigError("nothing to serve: the config has neither replay nor upstream")
    if replay is None:
        return ReplayEngine([], 0, True, volatility=Volatility(config.volatile), max_steps=config.max_steps)
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
        config.max_steps,
    )
