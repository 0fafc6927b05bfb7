"""Sandboxes started ahead of their rollouts (`reroll.sandbox.ahead`): taken once by run id, a
failed start taken as none, the ones no rollout took stopped, and the first one's launch before the
others'."""

from __future__ import annotations

import asyncio

import pytest
from reroll.sandbox import ahead
from reroll.sandbox.ahead import StartsAhead, discard_ahead, lead_first, start_ahead, take_ahead


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
    ahead._BATCHES.clear()
    ahead._batch = None


def launch(run_id: str, order: list[str]) -> None:
    """A backend's launch (in a worker thread): appends `run_id` to `order` inside `lead_first`."""
    with lead_first(run_id):
        order.append(run_id)


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


async def test_the_first_started_ahead_launches_before_the_others() -> None:
    order: list[str] = []
    for run_id in ("child-5", "child-6", "child-7"):
        start_ahead(Fake(), run_id)  # type: ignore[arg-type]
    followers = [asyncio.create_task(asyncio.to_thread(launch, r, order)) for r in ("child-6", "child-7")]
    await asyncio.sleep(0.05)
    assert order == []  # they wait for the lead's
    await asyncio.to_thread(launch, "child-5", order)
    await asyncio.gather(*followers)
    assert order[0] == "child-5" and sorted(order[1:]) == ["child-6", "child-7"]
    start_ahead(Fake(), "child-8")  # type: ignore[arg-type]  # a later batch: its own lead
    await asyncio.wait_for(asyncio.to_thread(launch, "child-8", order), 1.0)
    launch("child-9", order)  # not started ahead: no wait
    await discard_ahead()


async def test_a_lead_whose_start_ended_before_its_launch_lets_the_others_go() -> None:
    failing = Fake(fail=True)
    failing.go.set()
    start_ahead(failing, "child-10")  # type: ignore[arg-type]
    start_ahead(Fake(), "child-11")  # type: ignore[arg-type]
    assert await take_ahead("child-10", Fake()) is None  # type: ignore[arg-type]  # its start failed
    order: list[str] = []
    await asyncio.wait_for(asyncio.to_thread(launch, "child-11", order), 1.0)
    assert order == ["child-11"]
    await discard_ahead()


async def test_the_discarded_let_their_followers_go() -> None:
    start_ahead(Fake(), "child-12")  # type: ignore[arg-type]
    start_ahead(Fake(), "child-13")  # type: ignore[arg-type]
    batch = ahead._BATCHES["child-13"]
    await discard_ahead()
    assert batch.launched.is_set() and not ahead._BATCHES


def test_the_docker_sandbox_starts_ahead() -> None:
    from reroll.sandbox.docker.backend import DockerSandbox

    assert issubclass(DockerSandbox, StartsAhead)
