"""A helper process that serves every rollout of the controller: started by the first rollout
that needs it, joined and left by the others without a process start, stopped a few seconds
after the last one left (or when the event loop ends).

The LLM proxy (``python -m reroll_proxy --shared``, which serves the scripted model too, on a port
of its own) runs this way. It has an admin channel on loopback: JSON ``POST`` to add a rollout or
a script, ``DELETE`` to remove it, with an admin token that reaches the process through its
environment (never the disk, never a sandbox).

One process per kind and event loop (`shared_process`): a ``reroll`` command runs its rollouts on
one loop, so its rollouts share it; a test that runs ``asyncio.run`` per case gets one per case.
``REROLL_PROXY=per-rollout`` (`per_rollout`) gives each rollout processes of its own instead, with
their logs in its run folder's ``harness/``: the way to debug one rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import orjson
from reroll_contracts.childenv import child_environment
from reroll_contracts.errors import InfrastructureError

from reroll.host.child_process import ChildProcess

if TYPE_CHECKING:
    import aiohttp  # imported where used: a command starts its shared proxy before it loads

    # aiohttp (a quarter of a second) and pydantic, so that its start overlaps their imports
    from pydantic import BaseModel

LINGER_SECONDS = 5.0
"""How long a shared process with no rollout left keeps running, for the next rollout to join."""
ADMIN_TIMEOUT_SECONDS = 30.0
"""Longest wait for a shared process to add or remove a rollout."""
ADMIN_TOKEN_ENV = "REROLL_ADMIN_TOKEN"
"""The variable through which a shared process gets its admin token."""
MODE_ENV = "REROLL_PROXY"
"""``per-rollout``: one LLM proxy and scripted model process per rollout; unset or ``shared``: one
proxy process per controller process, serving the scripted models too."""
PROXY_MODULE, PROXY_NAME = "reroll_proxy", "proxy"
"""The shared LLM proxy's module and name (`reroll.host.llm_proxy`)."""
Answer = TypeVar("Answer", bound="BaseModel")


def per_rollout() -> bool:
    """Whether each rollout gets its own processes (``REROLL_PROXY=per-rollout``)."""
    return os.environ.get(MODE_ENV, "shared") == "per-rollout"


class SharedProcess:
    """One ``python -m MODULE --shared --admin-token-env REROLL_ADMIN_TOKEN`` child of this
    controller, and the rollouts it serves now (`users`).

    Its log is ``NAME.log`` in a private temporary folder (removed when it stops); its tail is in
    every error about it.

    Args:
        module: the module to run.
        name: names its log and ready file, and it in messages.
    """

    def __init__(self, module: str, name: str) -> None:
        self.loop = asyncio.get_running_loop()
        """The event loop it serves (its subprocess belongs to that loop)."""
        self.name = name
        self._admin_token = secrets.token_urlsafe(32)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"reroll-{name}-"))
        self._process = ChildProcess(
            module,
            ["--shared", "--admin-token-env", ADMIN_TOKEN_ENV],
            workdir=self.workdir,
            name=name,
            env=child_environment({ADMIN_TOKEN_ENV: self._admin_token}),
        )
        self._session: aiohttp.ClientSession | None = None
        self.users = 0
        """Rollouts served now."""
        self._linger: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        """What it announced in its ready file (its control site's base URL)."""
        return self._process.ready.address

    @property
    def pid(self) -> int | None:
        """Its process id, once started."""
        return self._process.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._process.alive()

    def log_tail(self) -> str:
        """The end of its log."""
        return self._process.log_tail()

    async def start(self) -> None:
        """Start the process and wait until it listens.

        Raises:
            InfrastructureError: it exited or was not ready in time (the message has its log's tail).
        """
        await self._process.start()
        import aiohttp  # see the module's imports

        self._session = aiohttp.ClientSession(headers={"Authorization": f"Bearer {self._admin_token}"})

    async def post(self, path: str, body: BaseModel, answer: type[Answer]) -> Answer:
        """``POST`` `body` to its admin route `path`; its answer.

        Raises:
            InfrastructureError: it refused (the cause it gave is in the message), died, or did
                not answer within `ADMIN_TIMEOUT_SECONDS`.
        """
        assert self._session is not None, "start() first"
        import aiohttp  # see the module's imports
        from pydantic import ValidationError

        url = self.address.removesuffix("/v1") + path
        try:
            async with self._session.post(
                url, data=body.model_dump_json(), timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_SECONDS)
            ) as response:
                data = await response.read()
                if response.status != 200:
                    raise InfrastructureError(f"the {self.name} refused the rollout: {_error_of(data)}")
                return answer.model_validate_json(data)
        except (aiohttp.ClientError, TimeoutError, ValidationError) as exc:
            raise InfrastructureError(
                f"the shared {self.name} did not add the rollout ({exc!r}):\n{self.log_tail()}"
            ) from exc

    async def delete(self, path: str) -> None:
        """``DELETE`` its admin route `path` (a dead process, or an error: nothing to do)."""
        if self._session is None or not self.alive():
            return
        import aiohttp  # see the module's imports

        url = self.address.removesuffix("/v1") + path
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._session.delete(url, timeout=aiohttp.ClientTimeout(total=ADMIN_TIMEOUT_SECONDS)):
                pass

    def acquire(self) -> None:
        """Count one more rollout (cancelling a pending stop)."""
        self.users += 1
        if self._linger is not None:
            linger, self._linger = self._linger, None
            linger.cancel()  # no longer its `_linger`: it stops nothing when the cancel lands

    def release(self) -> None:
        """Count one rollout less; with none left, stop after `LINGER_SECONDS`."""
        self.users -= 1
        if self.users == 0:
            self._linger = asyncio.ensure_future(self._stop_later())

    async def _stop_later(self) -> None:
        try:
            await asyncio.sleep(LINGER_SECONDS)
        finally:  # also when the loop ends and cancels it; not when `acquire` did (the cancel
            # lands later, perhaps after that rollout left again: another linger runs then)
            if self.users == 0 and self._linger is asyncio.current_task():
                await self.stop()

    async def stop(self) -> None:
        """Stop the process and remove its folder."""
        running = _RUNNING.get(self.loop, {})
        if running.get(self.name) is self:
            del running[self.name]
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._process.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


_RUNNING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, SharedProcess]] = (
    weakref.WeakKeyDictionary()
)
"""The shared processes of each running event loop, by name."""
_STARTING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)
"""Held while a loop's shared process of a name starts, so that two rollouts joining at once
start one; one lock per name, so that processes of two names start together."""
_PRESTARTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Task[None]]] = (
    weakref.WeakKeyDictionary()
)
"""The pending `prestart` tasks of each loop (kept referenced until they end)."""


async def shared_process(module: str, name: str) -> SharedProcess:
    """The running event loop's shared process `name` (``python -m module --shared``), started
    if there is none or it died; `SharedProcess.acquire` it before use.

    Raises:
        InfrastructureError: it could not be started.
    """
    loop = asyncio.get_running_loop()
    async with _STARTING.setdefault(loop, {}).setdefault(name, asyncio.Lock()):
        running = _RUNNING.setdefault(loop, {})
        process = running.get(name)
        if process is None or not process.alive():
            process = SharedProcess(module, name)
            try:
                await process.start()
            except BaseException:  # refused, or cancelled (its command ended): nothing left behind
                await process.stop()
                raise
            running[name] = process
        return process


def prestart(module: str, name: str) -> None:
    """Start the running loop's shared process `name` in the background (`shared_process`), so that
    the first rollout to join finds it started or starting instead of starting it then: a command
    about to start rollouts calls it first. Unjoined, it stops after `LINGER_SECONDS` as one the
    last rollout left; a start that fails is left to the first rollout's own start to report.
    Nothing under ``REROLL_PROXY=per-rollout``."""
    if per_rollout():
        return

    async def start() -> None:
        with contextlib.suppress(InfrastructureError):
            process = await shared_process(module, name)
            process.acquire()
            process.release()  # joined by none yet: lingers, then stops

    pending = _PRESTARTS.setdefault(asyncio.get_running_loop(), set())
    task = asyncio.ensure_future(start())
    pending.add(task)
    task.add_done_callback(pending.discard)


async def prestart_proxy() -> None:
    """`prestart` the shared LLM proxy (which serves the scripted models too) for the rollouts
    about to start, then yield once: its process is spawned when it returns, so that its start (a
    second of imports) overlaps the caller's next synchronous work."""
    prestart(PROXY_MODULE, PROXY_NAME)
    await asyncio.sleep(0)


def _error_of(body: bytes) -> str:
    """The ``error`` of a JSON error answer, else the body's start."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        error = None
    return str(error) if error else body.decode("utf-8", "replace")[:500]
