"""`prune`'s sweep of containers when another remover gets there first (an in-process unit test:
the race between two removals of one container cannot be timed with the real engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import docker
import docker.errors
import pytest
from requests import Response
from reroll.sandbox.docker.prune import _Sweep


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = Response()
    response.status_code = status
    return docker.errors.APIError("remove", response=response, explanation=explanation)


@dataclass
class Container:
    """A listed container whose removal fails with `error` (or succeeds when it is None)."""

    name: str
    error: Exception | None
    labels: dict[str, str] | None = None

    def remove(self, **_: Any) -> None:
        if self.error is not None:
            raise self.error


@dataclass
class Engine:
    listed: list[Container]

    @property
    def containers(self) -> Engine:
        return self

    def list(self, **_: Any) -> list[Container]:
        return self.listed


def sweep(*listed: Container) -> _Sweep:
    engine = cast(docker.DockerClient, Engine(list(listed)))
    return _Sweep(engine=engine, run_id=None, spare_live=False)


def test_a_container_another_remover_has_or_is_removing_is_skipped_not_an_error() -> None:
    """409 "removal … already in progress" (its own run or a concurrent prune) and 404 are not
    errors and not counted as removed by this prune; the others are removed."""
    busy = api_error(409, "removal of container abc is already in progress")
    gone = docker.errors.NotFound("no such container")
    done = sweep(Container("a", None), Container("b", busy), Container("c", gone), Container("d", None))
    done.containers()
    assert done.removed["containers"] == ["a", "d"]


def test_any_other_engine_error_is_raised() -> None:
    done = sweep(Container("a", api_error(409, "container is paused")))
    with pytest.raises(docker.errors.APIError, match="paused"):
        done.containers()
