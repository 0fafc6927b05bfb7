"""The shared ``full`` network (`reroll.sandbox.docker.networks.ensure_full_network`) on the real
engine: one network whatever races made, looked up without ambiguity."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import docker
import docker.errors
import pytest
from reroll.sandbox.docker.engine import docker_unreachable
from reroll.sandbox.docker.images import MANAGED_LABEL
from reroll.sandbox.docker.networks import FULL_NETWORK, ensure_full_network
from reroll.sandbox.docker.prune import prune

pytestmark = [pytest.mark.slow, pytest.mark.spawns]


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    """A client of the engine, closed after the test (an unclosed one's socket warns when it is
    collected, in whichever test runs then)."""
    reason = docker_unreachable()
    if reason:
        pytest.skip(reason)
    with contextlib.closing(docker.from_env()) as client:
        yield client


def _full_networks(engine: docker.DockerClient) -> list[str]:
    return [n.id for n in engine.networks.list(names=[FULL_NETWORK]) if n.name == FULL_NETWORK]


def test_concurrent_callers_share_one_network(engine: docker.DockerClient) -> None:
    """Eight threads asking at once (as rollouts starting together on a fresh machine do) get one
    network, and a lookup of it by name stays unambiguous."""
    with ThreadPoolExecutor(8) as pool:
        ids = {network.id for network in pool.map(lambda _: ensure_full_network(engine), range(8))}
    assert len(ids) == 1
    assert _full_networks(engine) == list(ids)
    assert engine.networks.get(FULL_NETWORK).id in ids


def test_a_duplicate_left_by_a_race_is_removed_and_the_oldest_kept(engine: docker.DockerClient) -> None:
    """Docker accepts a second network of the same name (what two unlocked creators made, and
    what broke every later ``networks.get(FULL_NETWORK)`` as ambiguous): the oldest one is kept
    and the unused newer one removed."""
    kept = ensure_full_network(engine)
    duplicate = engine.networks.create(FULL_NETWORK, driver="bridge", labels={MANAGED_LABEL: "1"})
    try:
        assert len(_full_networks(engine)) == 2
        assert ensure_full_network(engine).id == kept.id
        assert _full_networks(engine) == [kept.id]
    finally:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            duplicate.remove()


def test_prune_keeps_the_shared_network_nothing_uses(engine: docker.DockerClient) -> None:
    """A machine-wide prune between another rollout's finding the network and starting its
    container in it (by id) made that start fail with ``network ... not found``: the shared
    network outlives prune even when no container is in it."""
    kept = ensure_full_network(engine)
    removed = prune()
    assert FULL_NETWORK not in removed["networks"]
    assert engine.networks.get(kept.id).name == FULL_NETWORK
