"""A model the harness asks itself (the LLM judge, a persona User), recorded like an agent's.

`SideModel` opens the model (`reroll.models.spec.live_upstream`: a provider, or the scripted
model server), an LLM proxy of its own (`reroll.host.llm_proxy.LlmProxy`) that appends every
exchange to a trajectory file of the run folder in the exchange format of the agent's
(``trajectory/judge_trajectory.jsonl``, ``trajectory/user_trajectory.jsonl``), and an HTTP
session; `SideModel.complete` sends one OpenAI Chat Completions request through it and returns
the answer's text. The proxy listens on the host's loopback and is never opened to a sandbox
(no `Sandbox.allow_host_port`): the agent cannot reach it.

Replay: given a recorded trajectory, the proxy serves its first ``cut_index`` exchanges (all
of them by default) instead of asking the model, matching each request to the recorded
exchange of its thread and noting where a request differs (policy ``warn``, as for an agent:
`reroll_proxy.engine`); after them it forwards to the live model, if one is given, else refuses.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from reroll_contracts.errors import InfrastructureError
from reroll_contracts.proxy import ReplayConfig, StepDivergence, UpstreamConfig

from reroll.host.llm_proxy import LlmProxy
from reroll.models.spec import live_upstream, model_name, parse_model


class SideModel:
    """One harness-side model behind a recording proxy (see the module docstring); an async
    context manager.

    Args:
        trajectory_path: the run folder's trajectory file its exchanges are appended to.
        workdir: a private folder of the run's harness for the proxy's files (created, mode 0700).
        spec: the model (a ``--model`` spec); the requests carry its name (`model_name`).
        live: ask `spec` after the replayed exchanges; False: replay only (`spec` is not opened,
            so a recorded one that is not available here still replays).
        base: the folder a relative ``scripted:PATH`` of `spec` is relative to.
        replay: the recorded trajectory to serve first; None: record only.
        cut_index: how many of `replay`'s exchanges to serve before going live [default: all].
        error: the exception a failed request raises (`complete`).

    Raises (on enter):
        ModelError: `spec` cannot be used (an unknown provider, a missing key or script).
        InfrastructureError: the proxy or the model server did not start.
    """

    def __init__(
        self,
        trajectory_path: Path,
        workdir: Path,
        *,
        spec: str,
        live: bool = True,
        base: Path | None = None,
        replay: Path | None = None,
        cut_index: int | None = None,
        error: type[Exception] = InfrastructureError,
    ) -> None:
        self.trajectory_path = trajectory_path
        self.workdir = workdir
        self.spec = spec
        self.live = live
        self.base = base
        self.replay = replay
        self.cut_index = cut_index
        self.error = error
        self.model = model_name(spec)
        """The model name the requests carry."""
        self._stack = contextlib.AsyncExitStack()
        self._proxy: LlmProxy | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SideModel:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        async with contextlib.AsyncExitStack() as stack:
            upstream: UpstreamConfig | None = None
            if self.live:
                upstream = await stack.enter_async_context(
                    live_upstream(parse_model(self.spec, self.base), self.workdir)
                )
            self._proxy = await stack.enter_async_context(
                side_proxy(self.trajectory_path, self.workdir, upstream, self.replay, self.cut_index)
            )
            self._session = await stack.enter_async_context(
                aiohttp.ClientSession(headers={"Authorization": f"Bearer {self._proxy.token}"})
            )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.__aexit__(kind, exc, tb)

    async def complete(
        self, messages: list[dict[str, Any]], *, what: str, timeout_seconds: float, temperature: float = 0
    ) -> str:
        """The text of the model's answer to `messages` (OpenAI Chat Completions).

        Args:
            messages: the chat's messages (``role``, ``content``).
            what: names the request in an error (``judge model M … on criterion X``).
            timeout_seconds: wall-clock budget of the call.

        Raises:
            the `error` given: the proxy answered an HTTP error (a provider's error, an exhausted
                recording) or did not answer in time; the message names the model, `what`, the
                status and the start of the body. `InfrastructureError`: not a chat completion.
        """
        assert self._proxy is not None and self._session is not None, "use it as a context manager"
        body = {"model": self.model, "temperature": temperature, "messages": messages}
        try:
            async with self._session.post(
                f"{self._proxy.base_url}/chat/completions",
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout_seconds),
            ) as response:
                text = await response.text()
                if response.status != 200:
                    raise self.error(f"{what}: HTTP {response.status}: " + text[:500])
                answer = orjson.loads(text)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise self.error(f"{what}: no answer ({exc!r})") from exc
        try:
            return str(answer["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as exc:
            raise self.error(f"{what}: not a chat completion: {text[:300]}") from exc

    async def divergences(self) -> list[StepDivergence]:
        """Where a replayed request differed from the recorded one, so far."""
        assert self._proxy is not None, "use it as a context manager"
        return (await self._proxy.status()).divergences


def side_proxy(
    trajectory_path: Path,
    workdir: Path,
    upstream: UpstreamConfig | None,
    replay: Path | None,
    cut_index: int | None = None,
) -> LlmProxy:
    """A harness-side model's LLM proxy (not started): records into `trajectory_path`, serves
    the first `cut_index` exchanges of the recorded trajectory `replay` (policy ``warn``; None:
    all), forwards to `upstream` after them, listens on the host's loopback, and is never opened
    to a sandbox."""
    return LlmProxy(
        workdir=workdir,
        trajectory_path=trajectory_path,
        upstream=upstream,
        replay=ReplayConfig(trajectory_path=replay, cut_index=cut_index, divergence_policy="warn")
        if replay is not None
        else None,
        listen_host="127.0.0.1",
    )
