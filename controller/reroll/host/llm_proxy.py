"""The controller's handle on a rollout's LLM proxy (package ``reroll_proxy``).

By default every rollout of this controller process is served by one shared proxy process
(`SharedProxy`, ``python -m reroll_proxy --shared``): a rollout joining registers with it, one
leaving is removed, and neither starts a process. The shared proxy starts with the first rollout of
an event loop and stops a few seconds after the last one left (or when the loop ends).
``REROLL_PROXY=per-rollout`` gives each rollout its own process instead (easier to debug: one log
per rollout, in its ``harness/``). What passes between controller and proxy (config,
registration, status, stop, ready file) is typed once, in `reroll_contracts.proxy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from reroll_contracts.childenv import child_environment
from reroll_contracts.errors import InfrastructureError
from reroll_contracts.faults import FaultsUsed, load_plan
from reroll_contracts.proxy import (
    ProxyConfig,
    ProxyStatus,
    ProxyStop,
    ReadyFile,
    ReplayConfig,
    RolloutAdded,
    RolloutRegistration,
    UpstreamConfig,
    VolatileRule,
)
from reroll_contracts.trajectory import Place

from reroll.host.child_process import ChildProcess
from reroll.runfolder.run import PROXY_CONFIG, write_private

STATUS_TIMEOUT_SECONDS = 5.0
"""Longest wait for the proxy's status (and a shared proxy's answer to adding or removing a rollout)."""
SHARED_LINGER_SECONDS = 5.0
"""How long a shared proxy with no rollout left keeps running, for the next rollout to join."""
MODE_ENV = "REROLL_PROXY"
"""``per-rollout``: one proxy process per rollout; unset or ``shared``: one per controller process."""
_KEY_ENV = "REROLL_PROXY_UPSTREAM_KEY"
_CONTROLLER_TOKEN_ENV = "REROLL_PROXY_CONTROLLER_TOKEN"
_ADMIN_TOKEN_ENV = "REROLL_PROXY_ADMIN_TOKEN"
Answer = TypeVar("Answer", bound=BaseModel)
_VOLATILE_RULES = TypeAdapter(list[VolatileRule])


def recorded_sandbox_values(run_dir: Path) -> tuple[VolatileRule, ...]:
    """The ``value`` rules (the sandbox's paths) of the proxy that recorded `run_dir`.

    Args:
        run_dir: a run folder.

    Returns:
        The rules of its ``harness/proxy.json``; none when the folder has no such file (a run
        folder written by another tool) or its ``volatile`` list is not one of rules. Only that
        list is read, so a proxy.json of any reroll version gives its rules.
    """
    try:
        data = orjson.loads((run_dir / PROXY_CONFIG).read_bytes())
        rules = _VOLATILE_RULES.validate_python(data.get("volatile", []) if isinstance(data, dict) else [])
    except (OSError, orjson.JSONDecodeError, ValidationError):
        return ()
    return tuple(rule for rule in rules if rule.value is not None)


def faults_used(plan_path: Path, seed: int | None = None) -> FaultsUsed:
    """Check the fault plan at `plan_path` and say what config.json records of it.

    Args:
        plan_path: the YAML plan (see `reroll_contracts.faults`).
        seed: the seed of its probability draws [default: the plan's ``seed``].

    Raises:
        FaultPlanError: the file is missing or not a valid plan (the message names it).
    """
    plan = load_plan(plan_path)
    return FaultsUsed(plan_path=plan_path.resolve(), seed=plan.seed if seed is None else seed)


class SharedProxy:
    """One ``python -m reroll_proxy --shared`` process serving the rollouts of this controller
    process on one event loop (`reroll_proxy.server.ProxyHost`); get it with `shared_proxy`.

    Its control site listens on loopback; the admin token that adds and removes rollouts reaches
    it through its environment and is never on disk. Its log is ``proxy.log`` in a private
    temporary folder (removed when it stops); its tail is in every error about it.
    """

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        """The event loop it serves (its subprocess belongs to that loop)."""
        self.admin_token = secrets.token_urlsafe(32)
        self.workdir = Path(tempfile.mkdtemp(prefix="reroll-proxy-"))
        self._process = ChildProcess(
            "reroll_proxy",
            ["--shared", "--admin-token-env", _ADMIN_TOKEN_ENV],
            workdir=self.workdir,
            name="proxy",
            env=child_environment({_ADMIN_TOKEN_ENV: self.admin_token}),
        )
        self._session: aiohttp.ClientSession | None = None
        self.users = 0
        """Rollouts served now."""
        self._linger: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the process and wait until it listens.

        Raises:
            InfrastructureError: it exited or was not ready in time (the message has its log's tail).
        """
        await self._process.start()
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.admin_token}"})

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._process.alive()

    @property
    def pid(self) -> int | None:
        """Its process id, once started."""
        return self._process.pid

    def log_tail(self) -> str:
        """The end of its log."""
        return self._process.log_tail()

    async def add(self, registration: RolloutRegistration) -> RolloutAdded:
        """Have it serve one more rollout.

        Raises:
            InfrastructureError: it refused (the rollout's recording or fault plan does not load, its
                port cannot be bound: the cause is in the message), died, or did not answer in time.
        """
        assert self._session is not None, "start() first"
        url = self._process.ready.address.removesuffix("/v1") + "/_reroll/rollouts"
        try:
            async with self._session.post(
                url,
                data=registration.model_dump_json(),
                timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS * 6),
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise InfrastructureError(f"the LLM proxy refused the rollout: {_error_of(body)}")
                return RolloutAdded.model_validate_json(body)
        except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
            raise InfrastructureError(
                f"the shared LLM proxy did not add the rollout ({exc!r}):\n{self.log_tail()}"
            ) from exc

    async def remove(self, rollout_id: str) -> None:
        """Stop serving a rollout (a dead proxy or an unknown rollout: nothing to do)."""
        if self._session is None or not self.alive():
            return
        url = self._process.ready.address.removesuffix("/v1") + f"/_reroll/rollouts/{rollout_id}"
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.delete(
                url, timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS * 6)
            ):
                pass

    def acquire(self) -> None:
        """Count one more rollout (cancelling a pending stop)."""
        self.users += 1
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def release(self) -> None:
        """Count one rollout less; with none left, stop after `SHARED_LINGER_SECONDS`."""
        self.users -= 1
        if self.users == 0:
            self._linger = asyncio.ensure_future(self._stop_later())

    async def _stop_later(self) -> None:
        try:
            await asyncio.sleep(SHARED_LINGER_SECONDS)
        finally:  # also when the loop ends and cancels it
            if self.users == 0:
                await self.stop()

    async def stop(self) -> None:
        """Stop the process and remove its folder."""
        if _SHARED.get(self.loop) is self:
            del _SHARED[self.loop]
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


_SHARED: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedProxy] = weakref.WeakKeyDictionary()
"""The shared proxy of each running event loop."""
_STARTING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
"""Held while a loop's shared proxy starts, so that two rollouts joining at once start one."""


async def shared_proxy() -> SharedProxy:
    """The shared proxy of the running event loop, started if there is none (or it died).

    Raises:
        InfrastructureError: it could not be started.
    """
    loop = asyncio.get_running_loop()
    async with _STARTING.setdefault(loop, asyncio.Lock()):
        proxy = _SHARED.get(loop)
        if proxy is None or not proxy.alive():
            proxy = SharedProxy()
            await proxy.start()
            _SHARED[loop] = proxy
        return proxy


def _error_of(body: bytes) -> str:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    return str(error) if error else body.decode("utf-8", "replace")[:500]


class LlmProxy:
    """Start, query and stop one rollout's proxy: a rollout of the `SharedProxy` (default), or
    its own process when ``REROLL_PROXY=per-rollout``.

    The rollout's config is written to ``proxy.json`` in `workdir` (mode 0600; a later replay
    reads its volatile rules), a `reroll_contracts.proxy.ProxyConfig` holding the rollout token
    the agent presents. The upstream key and the controller's token (the only one ``/_reroll/*``
    accepts, never given to the sandbox) never reach the file: a per-rollout process gets them
    through its environment (``api_key_env``, ``controller_token_env``), which holds nothing else
    of the controller's (`reroll_contracts.childenv`) and which the proxy makes unreadable to
    other processes of its user once started; the shared proxy gets them in the rollout's
    registration, over loopback, with its admin token.

    Args:
        workdir: folder for the proxy's config, ready file and log.
        trajectory_path: where the proxy appends the exchanges it serves.
        upstream: the live model, or None (replay only).
        replay: what to replay first, or None (record only).
        listen_host: the interface to listen on, which the agent's base URL names: loopback for
            the local sandbox, the container network's gateway for docker.
        faults: the fault plan to inject, or None.
        volatile: the parts of a request that may differ from the recording (`reroll_proxy.volatile`).
    """

    def __init__(
        self,
        *,
        workdir: Path,
        trajectory_path: Path,
        upstream: UpstreamConfig | None,
        replay: ReplayConfig | None,
        listen_host: str = "127.0.0.1",
        faults: FaultsUsed | None = None,
        volatile: Sequence[VolatileRule] = (),
    ) -> None:
        self.token = secrets.token_urlsafe(24)
        """The rollout token: the agent's credential, for the model endpoints only."""
        self.controller_token = secrets.token_urlsafe(32)
        """The controller's credential for ``/_reroll/*``: never in the sandbox, never on disk."""
        env = child_environment(
            {_CONTROLLER_TOKEN_ENV: self.controller_token}
        )  # (`reroll_contracts.childenv`)
        if upstream is not None:
            env[_KEY_ENV] = upstream.api_key or "unused"
            upstream = upstream.model_copy(update={"api_key": None, "api_key_env": _KEY_ENV})
        config = ProxyConfig(
            listen_host=listen_host,
            token=self.token,
            controller_token_env=_CONTROLLER_TOKEN_ENV,
            trajectory_path=trajectory_path,
            replay=replay,
            upstream=upstream,
            faults=faults,
            volatile=list(volatile),
        )
        self.config_file = workdir / PROXY_CONFIG.name
        """The config file (a per-rollout proxy reads it)."""
        write_private(self.config_file, config.model_dump_json(indent=2).encode())
        self.shared = os.environ.get(MODE_ENV, "shared") != "per-rollout"
        """Whether the rollout is served by the `SharedProxy` (else by its own process)."""
        self._registration = RolloutRegistration(
            config=config, controller_token=self.controller_token, upstream_api_key=env.get(_KEY_ENV)
        )
        self._process = ChildProcess(
            "reroll_proxy", ["--config", str(self.config_file)], workdir=workdir, name="proxy", env=env
        )
        self._host: SharedProxy | None = None
        self._added: RolloutAdded | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        """The URL the agent uses, ending in ``/v1``."""
        return self._added.base_url if self._added is not None else self._process.ready.address

    async def start(self) -> None:
        """Start serving the rollout: join the shared proxy (started if none runs), or start its
        own process, and wait until it listens.

        Raises:
            InfrastructureError: the proxy did not start, or refused the rollout (the cause in the message).
        """
        if self.shared:
            host = await shared_proxy()
            host.acquire()
            try:
                self._added = await host.add(self._registration)
            except BaseException:
                host.release()
                raise
            self._host = host
            # Which process serves the rollout, where a per-rollout proxy's ready file would be.
            assert host.pid is not None
            ready = ReadyFile(pid=host.pid, address=self._added.base_url)
            write_private(self._process.ready_file, ready.model_dump_json().encode())
        else:
            await self._process.start()
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.controller_token}"})

    @property
    def pid(self) -> int | None:
        """The id of the process serving the rollout (the shared one, or its own), once started."""
        return self._host.pid if self._host is not None else self._process.pid

    def _log_tail(self) -> str:
        return self._host.log_tail() if self._host is not None else self._process.log_tail()

    async def status(self) -> ProxyStatus:
        """The proxy's counters, divergences and stop (``GET /_reroll/status``).

        Raises:
            InfrastructureError: the proxy died, did not answer within `STATUS_TIMEOUT_SECONDS`,
                or answered something that is not a `ProxyStatus`.
        """
        return await self._get("/_reroll/status", ProxyStatus, STATUS_TIMEOUT_SECONDS)

    async def set_place(self, place: Place) -> None:
        """Tag every exchange served from now on with `place` (``POST /_reroll/place``).

        Raises:
            InfrastructureError: the proxy died or did not accept it within `STATUS_TIMEOUT_SECONDS`.
        """
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + "/_reroll/place"
        try:
            async with self._session.post(
                url, data=place.model_dump_json(), timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS)
            ) as response:
                response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(
                f"LLM proxy did not take the trial place ({exc!r}):\n{self._log_tail()}"
            ) from exc

    async def wait_for_stop(self) -> ProxyStop:
        """Wait until the proxy refuses every further request (``GET /_reroll/stop``, a long poll).

        Returns as soon as the proxy decided to stop (replay-only cut point, strict divergence);
        waits forever otherwise: cancel it when the agent is done.

        Raises:
            InfrastructureError: the proxy died, or answered something that is not a `ProxyStop`.
        """
        return await self._get("/_reroll/stop", ProxyStop, None)

    async def _get(self, path: str, model: type[Answer], timeout_seconds: float | None) -> Answer:
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + path
        try:
            async with self._session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_seconds)
            ) as response:
                response.raise_for_status()
                return model.model_validate_json(await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(
                f"LLM proxy is not answering {path} ({exc!r}):\n{self._log_tail()}"
            ) from exc
        except ValidationError as exc:
            raise InfrastructureError(
                f"LLM proxy: invalid answer to {path} ({exc!r}):\n{self._log_tail()}"
            ) from exc

    async def stop(self) -> None:
        """Stop serving the rollout: leave the shared proxy (its trajectory closed after the last
        fsync), or stop its own process."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        host, self._host = self._host, None
        if host is not None:
            try:
                if self._added is not None:
                    await host.remove(self._added.rollout_id)
            finally:
                host.release()
        await self._process.stop()

    async def __aenter__(self) -> LlmProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
