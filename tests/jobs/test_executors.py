"""The executor seam: registry errors, a missing optional package, the start-up bound."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from reroll.jobs.executors import AsyncioExecutor, HeadStartGate, create_executor
from reroll.jobs.jobfile import JobSpec, RunnerOptions
from reroll.jobs.runner import run_job
from reroll.sandbox import base
from reroll_contracts.errors import JobError
from rich.console import Console

from tests.jobs import flaky_sandbox


def test_registry_errors_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(create_executor(RunnerOptions(concurrency=2, max_starting=1)), AsyncioExecutor)
    with pytest.raises(JobError, match=r"unknown executor 'dask'; known: asyncio, ray"):
        create_executor(RunnerOptions(executor="dask"))
    with pytest.raises(ValidationError, match=r"max_starting\n  Input should be greater than or equal to 1"):
        RunnerOptions(concurrency=2, max_starting=0)  # the bounds are checked once, by the options
    # ray not installed: importing it fails, and the error names the extra to install.
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "reroll.jobs.ray_executor", raising=False)
    missing = r"executor 'ray' needs a missing package .*pip install 'reroll\[ray\]'"
    with pytest.raises(JobError, match=missing):
        create_executor(RunnerOptions(executor="ray"))


async def test_job_with_missing_executor_package_fails_before_writing(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "reroll.jobs.ray_executor", raising=False)
    spec = JobSpec(name="j", tasks=[examples / "hello-file"], agents=["oracle"], executor="ray")
    with pytest.raises(JobError, match=r"reroll\[ray\]"):
        await run_job(spec, jobs_dir=tmp_path, console=Console(quiet=True))
    assert not (tmp_path / "j").exists()


@pytest.mark.spawns
@pytest.mark.parametrize(("max_starting", "expect_peak"), [(1, 1), (4, 4)])
async def test_max_starting_bounds_overlapping_starts(
    tmp_path: Path, examples: Path, monkeypatch: pytest.MonkeyPatch, max_starting: int, expect_peak: int
) -> None:
    """5 rollouts at concurrency 5: with max_starting 1 the sandbox starts never overlap; with 4
    the first starts alone, then the other four all at once (each start but the first waits for the
    others, see CountingSandbox)."""
    monkeypatch.setitem(base.BACKENDS, "counting", "tests.jobs.flaky_sandbox:CountingSandbox")
    monkeypatch.setitem(flaky_sandbox.STARTING, "peak", 0)
    monkeypatch.setitem(flaky_sandbox.STARTING, "begun", 0)
    monkeypatch.setitem(flaky_sandbox.STARTING, "overlap", expect_peak)
    spec = JobSpec(
        name="s",
        tasks=[examples / "hello-file"],
        agents=["oracle"],
        repeats=5,
        concurrency=5,
        max_starting=max_starting,
        sandbox="counting",
    )
    summary = await run_job(spec, jobs_dir=tmp_path, console=Console(quiet=True))
    assert summary.totals.status_counts == {"ok": 5}
    assert flaky_sandbox.STARTING["peak"] == expect_peak


@pytest.mark.parametrize("first_fails", [False, True])
async def test_the_first_holder_of_the_start_gate_starts_alone(first_fails: bool) -> None:
    """The others wait for the first start to end although places are free, then go in together;
    a first start that fails lets them in too."""
    gate, inside, let_go = HeadStartGate(3), [], asyncio.Event()

    async def start(name: str) -> None:
        async with gate:
            inside.append(name)
            if name == "first":
                await let_go.wait()
                if first_fails:
                    raise RuntimeError("its sandbox did not start")
            await asyncio.sleep(0)

    first = asyncio.ensure_future(start("first"))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(start(name)) for name in ("second", "third")]
    for _ in range(5):
        await asyncio.sleep(0)
    assert inside == ["first"]
    let_go.set()
    await asyncio.gather(*others)
    assert sorted(inside) == ["first", "second", "third"]
    assert isinstance(first.exception(), RuntimeError) if first_fails else first.result() is None
