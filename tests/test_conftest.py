"""The suite's own scheduling under `make test` (`tests.conftest`): the slowest units start first
(`slowest_first`), and pytest-xdist runs a module on one worker, save the modules split in parts
(`scheduling_unit`, `PartScheduling`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from tests import conftest
from tests.conftest import (
    ROOT,
    SLOWEST_UNITS,
    SPLIT_MODULES,
    PartScheduling,
    pytest_xdist_make_scheduler,
    scheduling_unit,
    slowest_first,
)

TESTS = ROOT / "tests"


@dataclass
class Collected:
    """What `slowest_first` reads of a collected test: its node id."""

    nodeid: str


@dataclass(eq=False)  # hashed by identity, as xdist keys its workers
class Worker:
    """What pytest-xdist's scheduler uses of a worker: the tests it was sent (indices into its
    collection)."""

    sent: list[int] = field(default_factory=list)
    shutting_down: bool = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    """`SPLIT_MODULES` and `SLOWEST_UNITS` of the tests below, whatever the suite's own are."""
    monkeypatch.setattr(conftest, "SPLIT_MODULES", ("agents/test_aider.py", "e2e/test_corpus_slice.py"))
    monkeypatch.setattr(
        conftest,
        "SLOWEST_UNITS",
        ("e2e/test_corpus_slice.py[b-docker]", "agents/test_openhands.py", "agents/test_aider.py"),
    )


def test_every_named_module_exists() -> None:
    modules = {unit.partition("[")[0] for unit in SLOWEST_UNITS} | set(SPLIT_MODULES)
    assert sorted(name for name in modules if not (TESTS / name).is_file()) == []


@pytest.mark.usefixtures("split")
def test_a_split_module_is_scheduled_by_parameter_id_and_the_others_by_module() -> None:
    assert scheduling_unit("tests/agents/test_codex.py::test_x[docker]") == "agents/test_codex.py"
    assert scheduling_unit("tests/agents/test_aider.py::test_x[docker]") == "agents/test_aider.py[docker]"
    assert scheduling_unit("tests/agents/test_aider.py::test_y") == "agents/test_aider.py[]"
    task = "tests/e2e/test_corpus_slice.py::test_t[terminal-bench-2/kv-store-grpc-local]"
    assert scheduling_unit(task) == "e2e/test_corpus_slice.py[terminal-bench-2/kv-store-grpc-local]"


@pytest.mark.usefixtures("split")
def test_the_slowest_units_come_first_and_each_unit_keeps_its_order() -> None:
    nodeids = [
        "tests/agents/test_codex.py::a",
        "tests/agents/test_aider.py::z[local]",
        "tests/agents/test_aider.py::y[docker]",
        "tests/e2e/test_corpus_slice.py::t[a-docker]",
        "tests/agents/test_openhands.py::z[local]",
        "tests/e2e/test_corpus_slice.py::t[b-docker]",
        "tests/agents/test_openhands.py::y[local]",
        "tests/test_cache.py::c",
        "elsewhere/test_x.py::x",
    ]
    items = [Collected(nodeid) for nodeid in nodeids]
    slowest_first(cast(list[Any], items))
    assert [item.nodeid for item in items] == [
        "tests/e2e/test_corpus_slice.py::t[b-docker]",
        "tests/agents/test_openhands.py::z[local]",
        "tests/agents/test_openhands.py::y[local]",
        "tests/agents/test_aider.py::z[local]",
        "tests/agents/test_aider.py::y[docker]",
        "tests/agents/test_codex.py::a",
        "tests/e2e/test_corpus_slice.py::t[a-docker]",
        "tests/test_cache.py::c",
        "elsewhere/test_x.py::x",
    ]


@pytest.mark.usefixtures("split")
def test_xdist_sends_a_worker_whole_units_in_collection_order(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test`'s ``--dist loadfile`` gets `PartScheduling` (xdist's own ``loadgroup`` groups
    nothing under pytest 9), which queues the units in collection order and sends a worker a whole
    unit."""
    monkeypatch.setattr(request.config.option, "dist", "loadfile")
    monkeypatch.setattr(request.config.option, "tx", ["1*popen"])
    monkeypatch.setattr(request.config.option, "loadscopereorder", False)
    scheduler = pytest_xdist_make_scheduler(request.config, None)
    assert isinstance(scheduler, PartScheduling)
    collection = [
        "tests/agents/test_aider.py::a[local]",
        "tests/agents/test_aider.py::b[local]",
        "tests/agents/test_aider.py::c[local]",
        "tests/agents/test_aider.py::a[docker]",
        "tests/agents/test_aider.py::b[docker]",
        "tests/agents/test_aider.py::d",
        "tests/agents/test_codex.py::a[local]",
        "tests/agents/test_codex.py::a[docker]",
    ]
    worker = Worker()
    scheduler.add_node(worker)
    scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert worker.sent == [0, 1, 2]  # a unit of three tests: no second one yet
    assert list(scheduler.workqueue) == [
        "agents/test_aider.py[docker]",
        "agents/test_aider.py[]",
        "agents/test_codex.py",
    ]
    monkeypatch.setattr(request.config.option, "dist", "load")
    assert pytest_xdist_make_scheduler(request.config, None) is None


def test_make_test_keeps_the_collection_order() -> None:
    """xdist reorders units by their number of tests unless told not to."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ")[1].split("\n\n")[0]
    assert "--dist loadfile --no-loadscope-reorder" in recipe
