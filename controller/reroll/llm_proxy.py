"""The controller's handle on one rollout's LLM proxy process (package ``reroll_proxy``)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel
from reroll_proxy import faults

from reroll.errors import FaultPlanError, InfrastructureError
from reroll.models import Upstream
from reroll.processes import ChildProcess
from reroll.runfolder import FaultsUsed

DivergencePolicy = Literal["warn", "strict", "cutover"]
_KEY_ENV = "REROLL_PROXY_UPSTREAM_KEY"


@dataclass(frozen=True)
class ReplayPlan:
    """What the proxy replays before it goes live."""

    trajectory_path: Path
    """The recorded llm_trajectory.jsonl."""
    cut_index: int
    """How many recorded exchanges to serve before the live model takes over."""
    divergence_policy: DivergencePolicy = "warn"
    """``warn``: serve the recording and note the divergence; ``strict``: abort the rollout;
    ``cutover``: go live at the first divergence (implemented by the proxy engine)."""


def faults_used(plan_path: Path, seed: int | None = None) -> FaultsUsed:
    """Check the fault plan at `plan_path` and say what config.json records of it.

    Args:
        plan_path: the YAML plan (see `reroll_proxy.faults`).
        seed: the seed of its probability draws [default: the plan's ``seed``].

    Raises:
        FaultPlanError: the file is missing or not a valid plan (the message names it).
    """
    try:
        plan = faults.load_plan(plan_path)
    except faults.FaultPlanError as exc:
        raise FaultPlanError(str(exc)) from exc
    return FaultsUsed(plan_path=str(plan_path.resolve()), seed=plan.seed if seed is None else seed)


class ProxyStatus(BaseModel):
    """The proxy's counters (``GET /_reroll/status``)."""

    served_replayed: int = 0
    served_live: int = 0
    cut_index: int = 0
    replay_exhausted: bool = False
    aborted: str | None = None
    divergences: list[dict[str, Any]] = []


class LlmProxy:
    """Start, query and stop the per-rollout proxy.

    Args:
        workdir: folder for the proxy's config, ready file and log.
        trajectory_path: where the proxy appends the exchanges it serves.
        upstream: the live model, or None (replay only).
        replay: what to replay first, or None (record only).
        listen_host: the interface to listen on, which the agent's base URL names: loopback for
            the local sandbox, the container network's gateway for docker.
        faults: the fault plan to inject, or None.
    """

    def __init__(
        self,
        *,
        workdir: Path,
        trajectory_path: Path,
        upstream: Upstream | None,
        replay: ReplayPlan | None,
        listen_host: str = "127.0.0.1",
        faults: FaultsUsed | None = None,
    ) -> None:
        self.token = secrets.token_urlsafe(24)
        config: dict[str, Any] = {
            "listen_host": listen_host,
            "token": self.token,
            "trajectory_path": str(trajectory_path),
            "replay_path": str(replay.trajectory_path) if replay else None,
            "cut_index": replay.cut_index if replay else 0,
            "divergence_policy": replay.divergence_policy if replay else "warn",
            "upstream": None,
            "faults_path": faults.plan_path if faults else None,
            "fault_seed": faults.seed if faults else None,
        }
        env = dict(os.environ)
        if upstream is not None:
            config["upstream"] = {
                "base_url": upstream.base_url,
                "model": upstream.model,
                "api_format": upstream.api_format,
                "api_key_env": _KEY_ENV,
            }
            env[_KEY_ENV] = upstream.api_key or "unused"
        config_file = workdir / "proxy.json"
        config_file.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
        self._process = ChildProcess(
            "reroll_proxy", ["--config", str(config_file)], workdir=workdir, name="proxy", env=env
        )
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        """The URL the agent uses, ending in ``/v1``."""
        return str(self._process.ready["base_url"])

    async def start(self) -> None:
        """Start the proxy and wait until it listens."""
        await self._process.start()
        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"})

    async def status(self) -> ProxyStatus:
        """The proxy's counters.

        Raises:
            InfrastructureError: the proxy died or did not answer within 5 s.
        """
        assert self._session is not None, "start() first"
        url = self.base_url.removesuffix("/v1") + "/_reroll/status"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                response.raise_for_status()
                return ProxyStatus.model_validate(await response.json())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise InfrastructureError(
                f"LLM proxy is not answering ({exc!r}):\n{self._process.log_tail()}"
            ) from exc

    async def stop(self) -> None:
        """Stop the proxy."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._process.stop()

    async def __aenter__(self) -> LlmProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
