"""Crash safety: SIGKILL the LLM proxy at seeded random points of recorded runs.

Each kill point records a run (a tool-calling loop through the official ``openai`` SDK, streamed
or not, against the real proxy and scripted model subprocesses), SIGKILLs the proxy after a
random delay, and checks that

- the run folder loads (`load_run_folder`);
- it holds every exchange the client received, with the content the client received;
- a continuation (a new proxy replaying the killed recording, then live) completes the run:
  the client gets every turn, the first ones replayed, and the stitched trajectory loads.

The shared proxy (one process, several rollouts) is killed the same way while two rollouts record
at once: each one's run folder holds every exchange its client received.

This is the proxy-level form of ``reroll continue``; the full command is exercised on a killed
mini-swe-agent rollout in tests/e2e/test_crash_rollouts.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from reroll.runfolder.run import TRAJECTORY, RunConfig, create_run_folder, load_run_folder, write_json

from tests.proxy.conftest import (
    ADMIN_TOKEN,
    TOKEN,
    Service,
    Turn,
    ask,
    converse,
    register_rollout,
    start_service,
)

pytestmark = pytest.mark.spawns  # the proxy and the scripted model run as subprocesses, SIGKILLed

KILL_POINTS_PER_MODE = 12
"""Kill points of the proxy per mode (streamed, plain): the run's duration is cut into this many
equal strata (two per turn) and one point is drawn in each, so every turn of either mode is
killed at least twice, at a random moment of its request, stream, recording or the agent's work
between turns. (The 52 points this test once drew uniformly over the run left 5 of these 24
strata untried, the first half turn of both modes among them.)"""
SHARED_KILL_POINTS = 8
"""Kill points of the shared proxy, each with two rollouts recording at once."""
SEED = 20261123
TURNS = 6
SCRIPT = {
    "turns": [
        {
            "content": f"Step {k}: " + "thinking about the files in the workspace. " * 6,
            "delay_seconds": 0.02,
            "tool_calls": [{"name": "bash", "arguments": {"command": f"echo step {k} && ls -la /tmp"}}],
        }
        for k in range(TURNS - 1)
    ]
    + [{"content": "All done."}],
}


def start_proxy(workdir: Path, trajectory: Path, upstream: str, replay: Path | None = None) -> Service:
    """The real proxy subprocess, recording to `trajectory`; replaying `replay` first if given."""
    config: dict[str, Any] = {
        "token": TOKEN,
        "trajectory_path": str(trajectory),
        "upstream": {"base_url": upstream, "api_key_env": "REROLL_TEST_UPSTREAM_KEY", "timeout_seconds": 10},
    }
    if replay is not None:
        config["replay"] = {"trajectory_path": str(replay)}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "proxy.json").write_text(json.dumps(config))
    return start_service("reroll_proxy", ["--config", str(workdir / "proxy.json")], workdir, "proxy")


def agent_loop(base_url: str, *, stream: bool, received: list[Turn], token: str = TOKEN) -> None:
    """A tiny agent: `TURNS` tool-calling turns; appends each turn once fully received; stops
    at the first connection error (the proxy was killed)."""

    def ask_and_keep(client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool) -> Turn:
        turn = ask(client, messages, stream=stream)
        received.append(turn)
        return turn

    with (
        openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=10) as client,
        contextlib.suppress(openai.APIError),
    ):
        converse(client, TURNS, stream=stream, task="Work through the steps.", ask_turn=ask_and_keep)


def as_received(exchange_body: dict[str, Any]) -> tuple[str | None, list[tuple[str, str, str]]]:
    """What an agent gets from a recorded response body: content and (id, name, arguments)."""
    message = exchange_body["choices"][0]["message"]
    calls = [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]
    return message.get("content") or None, calls


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("crash-model")
    (workdir / "script.json").write_text(json.dumps(SCRIPT))
    service = start_service(
        "reroll_proxy.scripted", ["--script", str(workdir / "script.json")], workdir, "model"
    )
    yield service
    service.stop()


def record_until_killed(root: Path, upstream: str, *, stream: bool, delay: float) -> tuple[Path, list[Turn]]:
    """Record a run and SIGKILL its proxy after `delay` seconds; the run folder and what the agent got."""
    run_dir = create_run_folder(root, "run")
    write_json(run_dir / "config.json", RunConfig(task_path="crash-test", agent="loop", model="scripted"))
    write_json(run_dir / "prompts.json", ["Work through the steps."])
    proxy = start_proxy(root / "proxy", run_dir / TRAJECTORY, upstream)
    received: list[Turn] = []
    agent = threading.Thread(
        target=agent_loop, args=(proxy.base_url,), kwargs={"stream": stream, "received": received}
    )
    agent.start()
    time.sleep(delay)
    os.kill(proxy.process.pid, signal.SIGKILL)
    proxy.process.wait(timeout=10)
    agent.join(timeout=30)
    assert not agent.is_alive(), "the agent hung after the proxy died"
    return run_dir, received


def check_kill_point(root: Path, upstream: str, *, stream: bool, delay: float) -> str:
    """One kill point; returns a one-line description. Raises AssertionError on a failure."""
    run_dir, received = record_until_killed(root, upstream, stream=stream, delay=delay)
    folder = load_run_folder(run_dir)
    recorded = [as_received(exchange.response.body) for exchange in folder.exchanges]
    assert len(recorded) >= len(received), f"{len(received)} received but {len(recorded)} recorded"
    for step, turn in enumerate(received):
        assert recorded[step] == (turn.content, turn.tool_calls), (
            f"step {step} differs from what the agent got"
        )
    # Continue: replay what was recorded, then go live, to the end of the script.
    continued = create_run_folder(root, "continued")
    proxy = start_proxy(root / "proxy-2", continued / TRAJECTORY, upstream, replay=run_dir / TRAJECTORY)
    finished: list[Turn] = []
    try:
        agent_loop(proxy.base_url, stream=stream, received=finished)
    finally:
        proxy.stop()
    assert len(finished) == TURNS, f"the continuation stopped after {len(finished)} turns"
    assert [(t.content, t.tool_calls) for t in finished[: len(received)]] == [
        (t.content, t.tool_calls) for t in received
    ]
    write_json(continued / "config.json", folder.config)
    write_json(continued / "prompts.json", folder.prompts)
    stitched = load_run_folder(continued).exchanges
    sources = [exchange.metadata.source for exchange in stitched]
    cut = len(recorded)
    assert sources == ["replayed"] * cut + ["live"] * (TURNS - cut)
    return f"delay {delay:.3f} s, {'stream' if stream else 'plain'}: {len(received)} received, {cut} recorded"


def run_seconds(upstream: str, root: Path, *, stream: bool) -> float:
    """How long a whole run takes through a proxy (the range kill delays are drawn from)."""
    proxy = start_proxy(root, root / "t.jsonl", upstream)
    reference: list[Turn] = []
    started = time.monotonic()
    agent_loop(proxy.base_url, stream=stream, received=reference)
    elapsed = time.monotonic() - started
    proxy.stop()
    assert len(reference) == TURNS
    return elapsed


def test_proxy_sigkill_at_random_points(
    model: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(SEED)
    started = time.monotonic()
    durations = {
        mode: run_seconds(model.base_url, tmp_path / f"probe-{mode}", stream=mode) for mode in (False, True)
    }
    passed, failures = 0, []
    strata = [(stream, stratum) for stratum in range(KILL_POINTS_PER_MODE) for stream in (False, True)]
    for point, (stream, stratum) in enumerate(strata):
        delay = durations[stream] * (stratum + rng.random()) / KILL_POINTS_PER_MODE
        try:
            description = check_kill_point(tmp_path / f"k{point}", model.base_url, stream=stream, delay=delay)
        except AssertionError as exc:
            failures.append(f"kill point {point} (delay {delay:.3f} s, stream={stream}): {exc}")
        else:
            passed += 1
            print(f"kill point {point}: {description}")
    elapsed = time.monotonic() - started
    with capsys.disabled():  # shown in every test run, not only on failure
        print(f"\nproxy SIGKILL: {len(strata)} kill points tried, {passed} passed ({elapsed:.1f} s)")
    assert not failures, "\n".join(failures)


def test_shared_proxy_sigkill_keeps_what_each_rollout_received(
    model: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REROLL_TEST_ADMIN_TOKEN", ADMIN_TOKEN)
    rng = random.Random(SEED + 1)
    longest = run_seconds(model.base_url, tmp_path / "probe", stream=True)
    for point in range(SHARED_KILL_POINTS):
        root = tmp_path / f"s{point}"
        root.mkdir()
        shared = start_service(
            "reroll_proxy", ["--shared", "--admin-token-env", "REROLL_TEST_ADMIN_TOKEN"], root, "shared"
        )
        stream = rng.random() < 0.5
        agents: list[tuple[Path, list[Turn], threading.Thread]] = []
        for name in ("a", "b"):
            run_dir = create_run_folder(root, name)
            write_json(
                run_dir / "config.json", RunConfig(task_path="crash-test", agent="loop", model="scripted")
            )
            write_json(run_dir / "prompts.json", ["Work through the steps."])
            code, added = register_rollout(
                shared,
                run_dir / TRAJECTORY,
                token=f"{name}-token",
                controller_token=f"{name}-c",
                upstream=model.base_url,
            )
            assert code == 200, added
            received: list[Turn] = []
            thread = threading.Thread(
                target=agent_loop,
                args=(added["base_url"],),
                kwargs={"stream": stream, "received": received, "token": f"{name}-token"},
            )
            agents.append((run_dir, received, thread))
        for _, _, thread in agents:
            thread.start()
        time.sleep(rng.uniform(0.0, longest))
        os.kill(shared.process.pid, signal.SIGKILL)
        shared.process.wait(timeout=10)
        for run_dir, received, thread in agents:
            thread.join(timeout=30)
            assert not thread.is_alive(), f"kill point {point}: an agent hung after the proxy died"
            recorded = [
                as_received(exchange.response.body) for exchange in load_run_folder(run_dir).exchanges
            ]
            assert len(recorded) >= len(received), (
                f"kill point {point}, {run_dir.name}: lost a received exchange"
            )
            for step, turn in enumerate(received):
                assert recorded[step] == (turn.content, turn.tool_calls), (
                    f"kill point {point}: step {step} differs"
                )
