"""Sandboxes started ahead of their rollouts (`reroll.sandbox.ahead`): taken once by run id, a
failed start taken as none, and the ones no rollout took stopped."""

from __future__ import annotations

import asyncio

import pytest
from reroll.sandbox import ahead
from reroll.sandbox.ahead import StartsAhead, discard_ahead, start_ahead, take_ahead


class Fake:
    """Stands in for a sandbox: its start waits for `go` (or fails), and it counts its stops."""

    def __init__(self, fail: bool = False) -> None:
        self.go = asyncio.Event()
        self.fail = fail
        self.started = False
        self.stops = 0

    async def start(self) -> None:
        await self.go.wait()
        if self.fail:
            raise OSError("refused")
        self.started = True

    async def stop(self) -> None:
        self.stops += 1


@pytest.fixture(autouse=True)
def empty() -> None:
    ahead._AHEAD.clear()


async def test_a_sandbox_started_ahead_is_taken_once_its_start_ended() -> None:
    fake = Fake()
    start_ahead(fake, "child-0")  # type: ignore[arg-type]
    # Its own start (started ahead) does not take itself.
    assert await take_ahead("child-0", fake) is None  # type: ignore[arg-type]
    taking = asyncio.create_task(take_ahead("child-0", Fake()))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not taking.done()  # waits for the start
    fake.go.set()
    assert id(await taking) == id(fake) and fake.started
    assert await take_ahead("child-0", Fake()) is None  # type: ignore[arg-type]  # taken once
    await discard_ahead()
    assert fake.stops == 0  # the taker's now


async def test_another_run_id_takes_nothing_and_a_failed_start_is_none() -> None:
    failing = Fake(fail=True)
    failing.go.set()
    start_ahead(failing, "child-1")  # type: ignore[arg-type]
    assert await take_ahead("child-2", Fake()) is None  # type: ignore[arg-type]
    assert await take_ahead("child-1", Fake()) is None  # type: ignore[arg-type]


async def test_the_ones_no_rollout_took_are_cancelled_and_stopped() -> None:
    waiting, done = Fake(), Fake()
    done.go.set()
    start_ahead(waiting, "child-3")  # type: ignore[arg-type]
    start_ahead(done, "child-4")  # type: ignore[arg-type]
    start_ahead(Fake(), "child-4")  # type: ignore[arg-type]  # one per run id: the first stays
    await asyncio.sleep(0)
    await discard_ahead()
    assert (waiting.stops, waiting.started, done.stops, done.started) == (1, False, 1, True)
    assert await take_ahead("child-4", Fake()) is None  # type: ignore[arg-type]


def test_the_docker_sandbox_starts_ahead() -> None:
    from reroll.sandbox.docker.backend import DockerSandbox

    assert issubclass(DockerSandbox, StartsAhead)
