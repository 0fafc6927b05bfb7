"""The controller's handle on a rollout's LLM proxy (package ``reroll_proxy``).

By default every rollout of this controller process is served by one shared proxy process
(``python -m reroll_proxy --shared``, run as a `reroll.host.shared_process.SharedProcess`): a
rollout joining registers with it, one leaving is removed, and neither starts a process.
``REROLL_PROXY=per-rollout`` gives each rollout its own process instead (easier to debug: one log
per rollout, in its ``harness/``). What passes between controller and proxy (config,
registration, status, stop, ready file) is typed once, in `reroll_contracts.proxy`.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson
from pydantic import BaseModel, RootModel, TypeAdapter, ValidationError
from reroll_contracts.asks import AskAnswer, PendingAsk
from reroll_contracts.childenv import child_environment
from reroll_contracts.datafile import read_data_file
from reroll_contracts.errors import InfrastructureError
from reroll_contracts.faults import FaultsUsed, load_plan
from reroll_contracts.proxy import (
    FreezePlan,
    HeldStep,
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
from reroll.host.shared_process import (
    PROXY_MODULE,
    PROXY_NAME,
    SharedProcess,
    per_rollout,
    prestart,
    shared_process,
)
from reroll.runfolder.paths import RunPaths, proxy_config_in
from reroll.runfolder.run import MAX_JSON_BYTES, write_private

STATUS_TIMEOUT_SECONDS = 5.0
"""Longest wait for the proxy's status (and a shared proxy's answer to adding or removing a rollout)."""
_KEY_ENV = "REROLL_PROXY_UPSTREAM_KEY"
_CONTROLLER_TOKEN_ENV = "REROLL_PROXY_CONTROLLER_TOKEN"
ROLLOUTS_ROUTE = "/_reroll/rollouts"
"""The shared proxy's admin route (`reroll_proxy.host.ProxyHost`)."""
Answer = TypeVar("Answer", bound=BaseModel)
_PendingAsks = RootModel[list[PendingAsk]]


def prestart_proxy() -> None:
    """Start the shared LLM proxy in the background (`reroll.host.shared_process.prestart`), for
    the rollouts about to start; nothing under ``REROLL_PROXY=per-rollout``."""
    prestart(PROXY_MODULE, PROXY_NAME)


class Released(BaseModel):
    """The proxy's answer to ``POST /_reroll/release``: how long it held the request, in seconds."""

    held_seconds: float


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
        data = orjson.loads(read_data_file(RunPaths(run_dir).proxy_config, MAX_JSON_BYTES, root=run_dir))
        rules = _VOLATILE_RULES.validate_python(data.get("volatile", []) if isinstance(data, dict) else [])
    except (OSError, ValueError):  # ValueError: invalid JSON or rules, DataFileError
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
        token: the rollout token [default: a new one]: a process restored from another rollout
            presents that rollout's (`reroll.rollout.process_layer`).
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
        hold_every: int = 0,
        max_steps: int | None = None,
        token: str | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
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
            hold_every=hold_every,
            max_steps=max_steps,
        )
        self.config_file = proxy_config_in(workdir)
        """The config file (a per-rollout proxy reads it)."""
        write_private(self.config_file, config.model_dump_json(indent=2).encode())
        self.shared = not per_rollout() and token is None
        """Whether the rollout is served by the `SharedProxy` (else by its own process: also when
        `token` is given, which other rollouts may hold too, and the shared one routes by token)."""
        self._registration = RolloutRegistration(
            config=config, controller_token=self.controller_token, upstream_api_key=env.get(_KEY_ENV)
        )
        self._process = ChildProcess(
            "reroll_proxy", ["--config", str(self.config_file)], workdir=workdir, name="proxy", env=env
        )
        self._host: SharedProcess | None = None
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
            host = await shared_process(PROXY_MODULE, PROXY_NAME)
            host.acquire()
            try:
                self._added = await host.post(ROLLOUTS_ROUTE, self._registration, RolloutAdded)
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

    @property
    def ask_url(self) -> str:
        """Where the sandbox posts an ask_user question (``/reroll/ask_user``, the rollout token)."""
        return self.base_url.removesuffix("/v1") + "/reroll/ask_user"

    async def next_asks(self, wait_seconds: float = 20.0) -> list[PendingAsk]:
        """The agent's questions not handed out yet (``GET /_reroll/asks``): waits up to
        `wait_seconds` for one, then answers an empty list.

        Raises:
            InfrastructureError: the proxy died, or answered something that is not a list of questions.
        """
        asks = await self._get(
            f"/_reroll/asks?wait={wait_seconds}", _PendingAsks, wait_seconds + STATUS_TIMEOUT_SECONDS
        )
        return asks.root

    async def answer_ask(self, ask: int, answer: str) -> bool:
        """Answer question `ask` (``POST /_reroll/asks/{id}``).

        Returns:
            False when the question no longer waits (its agent gave up), else True.

        Raises:
            InfrastructureError: the proxy died or refused the answer.
        """
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + f"/_reroll/asks/{ask}"
        body = AskAnswer(answer=answer).model_dump_json()
        try:
            async with self._session.post(
                url, data=body, timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS)
            ) as response:
                if response.status == 404:
                    return False
                response.raise_for_status()
                return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(
                f"LLM proxy did not take the answer to question {ask} ({exc!r}):\n{self._process.log_tail()}"
            ) from exc

    async def wait_for_stop(self) -> ProxyStop:
        """Wait until the proxy refuses every further request (``GET /_reroll/stop``, a long poll).

        Returns as soon as the proxy decided to stop (replay-only cut point, strict divergence);
        waits forever otherwise: cancel it when the agent is done.

        Raises:
            InfrastructureError: the proxy died, or answered something that is not a `ProxyStop`.
        """
        return await self._get("/_reroll/stop", ProxyStop, None)

    async def wait_for_held(self) -> HeldStep:
        """Wait until the proxy holds a live request at a step boundary (``hold_every``) and
        return it (``GET /_reroll/held``, a long poll); `release` it after the checkpoint. With a
        `freeze_at_holds` plan, the step was frozen and let go already (``frozen``): no release.

        Raises:
            InfrastructureError: the proxy died, or answered something that is not a `HeldStep`.
        """
        return await self._get("/_reroll/held", HeldStep, None)

    async def freeze_at_holds(self, plan: FreezePlan) -> None:
        """Have the proxy take `plan`'s snapshot itself at each step it would hold, and hold the
        request no longer (``POST /_reroll/freeze``).

        Raises:
            InfrastructureError: the proxy died or refused the plan.
        """
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + "/_reroll/freeze"
        try:
            timeout = aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS)
            async with self._session.post(url, data=plan.model_dump_json(), timeout=timeout) as response:
                response.raise_for_status()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(
                f"LLM proxy did not take the freeze plan ({exc!r}):\n{self._process.log_tail()}"
            ) from exc

    async def release(self, step: int) -> float:
        """Let the held request of `step` go on (``POST /_reroll/release``).

        Returns:
            How long the proxy held it, in seconds (the wait the agent saw: `wait_for_held`'s
            answer, the checkpoint and this call's request included).

        Raises:
            InfrastructureError: the proxy died, holds no request of that step, or answered
                something that is not a `Released`.
        """
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + f"/_reroll/release?step={step}"
        try:
            timeout = aiohttp.ClientTimeout(total=STATUS_TIMEOUT_SECONDS)
            async with self._session.post(url, timeout=timeout) as response:
                response.raise_for_status()
                return Released.model_validate_json(await response.read()).held_seconds
        except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
            raise InfrastructureError(
                f"LLM proxy did not release step {step} ({exc!r}):\n{self._process.log_tail()}"
            ) from exc

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
                    await host.delete(f"{ROLLOUTS_ROUTE}/{self._added.rollout_id}")
            finally:
                host.release()
        await self._process.stop()

    async def __aenter__(self) -> LlmProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
