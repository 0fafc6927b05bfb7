"""The controller's proxy handle against the real proxy process: the typed config file, typed
status, and the stop pushed to the controller before the agent sees the cut-point 409."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from reroll.host.llm_proxy import LlmProxy, recorded_sandbox_values
from reroll.host.shared_process import MODE_ENV
from reroll.models.spec import ModelSpec, live_upstream
from reroll_contracts.errors import InfrastructureError
from reroll_contracts.faults import FaultsUsed
from reroll_contracts.proxy import ProxyConfig, ReplayConfig, VolatileRule

pytestmark = pytest.mark.spawns  # the real proxy and scripted model processes
SCRIPT = "turns:\n  - content: first\n  - content: second\n"


@pytest.fixture(autouse=True, params=["shared", "per-rollout"])
def proxy_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test against the shared proxy and against a proxy process of the rollout's own."""
    monkeypatch.setenv(MODE_ENV, request.param)
    return str(request.param)


@pytest.fixture
def model(tmp_path: Path) -> ModelSpec:
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    return ModelSpec(spec=f"scripted:{script}", name="scripted", script=script)


async def ask(proxy: LlmProxy, turn: int) -> str | None:
    """One Chat Completions call through `proxy` with the official SDK, as an agent makes it."""
    messages: list[dict[str, str]] = [{"role": "user", "content": "go"}]
    messages += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "go on"}] * turn
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key=proxy.token, max_retries=0) as sdk:
        reply = await sdk.chat.completions.create(model="scripted", messages=messages)  # type: ignore[arg-type]
    return reply.choices[0].message.content


async def test_the_config_file_is_a_proxy_config_without_the_key(tmp_path: Path, model: ModelSpec) -> None:
    async with live_upstream(model, tmp_path) as upstream:
        secret = upstream.model_copy(update={"api_key": "sk-never-on-disk"})
        replay = ReplayConfig(
            trajectory_path=tmp_path / "recorded.jsonl", cut_index=0, divergence_policy="strict"
        )
        faults = FaultsUsed(plan_path=tmp_path / "plan.yaml", seed=7)
        proxy = LlmProxy(
            workdir=tmp_path,
            trajectory_path=tmp_path / "out.jsonl",
            upstream=secret,
            replay=replay,
            faults=faults,
        )
        text = proxy.config_file.read_text()
        assert "sk-never-on-disk" not in text
        written = ProxyConfig.model_validate_json(text)
        assert written.upstream is not None and written.upstream.api_key_env is not None
        assert (written.replay, written.faults) == (replay, faults)  # as given: one model each


def test_the_sandbox_values_written_are_read_back_for_a_replay(tmp_path: Path) -> None:
    (tmp_path / "harness").mkdir()
    rules = [VolatileRule(value="/tmp/s1/app", label="workspace"), VolatileRule(pattern=r"\d+")]
    LlmProxy(
        workdir=tmp_path / "harness",
        trajectory_path=tmp_path / "out.jsonl",
        upstream=None,
        replay=None,
        volatile=rules,
    )
    assert recorded_sandbox_values(tmp_path) == (rules[0],)
    assert recorded_sandbox_values(tmp_path / "harness") == ()  # no proxy.json: a foreign run folder


def test_the_sandbox_values_of_an_earlier_versions_proxy_json_are_read(tmp_path: Path) -> None:
    """A run recorded before the replay and the faults were nested (flat ``replay_path``,
    ``cut_index``, ``faults_path``...) still gives its recorded sandbox values to a replay."""
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "proxy.json").write_text(
        '{"token": "t", "trajectory_path": "/r/out.jsonl", "replay_path": null, "cut_index": 0,'
        ' "divergence_policy": "warn", "faults_path": null, "fault_seed": null,'
        ' "volatile": [{"value": "/tmp/s1/app", "label": "workspace"}, {"path": "metadata.id"}]}'
    )
    assert recorded_sandbox_values(tmp_path) == (VolatileRule(value="/tmp/s1/app", label="workspace"),)
    (tmp_path / "harness" / "proxy.json").write_text('{"volatile": [{"value": 3}]}')  # not rules
    assert recorded_sandbox_values(tmp_path) == ()


@contextlib.asynccontextmanager
async def recording_proxy(model: ModelSpec, workdir: Path) -> AsyncIterator[LlmProxy]:
    """A running proxy recording `model`'s answers into ``workdir/out.jsonl``."""
    async with (
        live_upstream(model, workdir) as upstream,
        LlmProxy(
            workdir=workdir, trajectory_path=workdir / "out.jsonl", upstream=upstream, replay=None
        ) as proxy,
    ):
        yield proxy


async def test_record_status_is_typed_and_never_stops(tmp_path: Path, model: ModelSpec) -> None:
    async with recording_proxy(model, tmp_path) as proxy:
        waiting = asyncio.create_task(proxy.wait_for_stop())
        assert await ask(proxy, 0) == "first"
        status = await proxy.status()
        assert (status.served_live, status.served_replayed, status.stop) == (1, 0, None)
        assert not waiting.done()
        waiting.cancel()


async def test_the_stop_is_pushed_and_set_before_the_409(tmp_path: Path, model: ModelSpec) -> None:
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    async with recording_proxy(model, recorded) as proxy:
        assert [await ask(proxy, turn) for turn in (0, 1)] == ["first", "second"]
    replay = ReplayConfig(trajectory_path=recorded / "out.jsonl", cut_index=1)
    async with LlmProxy(
        workdir=tmp_path, trajectory_path=tmp_path / "out.jsonl", upstream=None, replay=replay
    ) as proxy:
        waiting = asyncio.create_task(proxy.wait_for_stop())
        assert await ask(proxy, 0) == "first"
        assert not waiting.done()
        with pytest.raises(openai.ConflictError):
            await ask(proxy, 1)
        status = await proxy.status()  # right after the 409, as an agent that exits at once
        assert status.stop is not None and status.stop.kind == "replay_exhausted"
        assert (status.stop.step, status.served_replayed) == (1, 1)
        assert await asyncio.wait_for(waiting, 10) == status.stop


async def test_a_dead_proxy_is_an_infrastructure_error(tmp_path: Path, model: ModelSpec) -> None:
    async with recording_proxy(model, tmp_path) as proxy:
        waiting = asyncio.create_task(proxy.wait_for_stop())
        assert proxy.pid is not None
        os.kill(proxy.pid, signal.SIGKILL)
        with pytest.raises(InfrastructureError, match="/_reroll/stop"):
            await asyncio.wait_for(waiting, 10)
