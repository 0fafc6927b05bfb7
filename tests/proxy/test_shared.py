"""One ``python -m reroll_proxy --shared`` process serving several rollouts at once: each keeps its
own recording, replay, fault plan and tokens, as if it were alone; one rollout's bad recording
refuses that rollout only; its admin routes (the scripted model's too) open with its admin token only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from reroll_contracts.scripted_admin import SCRIPTS_ROUTE

from tests.proxy.conftest import (
    TURNS,
    Recording,
    Service,
    Turn,
    admin,
    converse,
    http_json,
    register_rollout,
)

pytestmark = pytest.mark.spawns  # the real shared proxy and scripted model processes


def stable(line: dict[str, Any]) -> Any:
    """An exchange line without what differs between two runs of the same conversation (times,
    durations, the ids the scripted model draws)."""
    varying = {"timestamp", "duration_ms", "ttfb_ms", "event_offsets_ms", "id", "created", "date", "host"}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in varying}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(line)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def conversation(base_url: str, token: str, *, retries: int = 0) -> list[Turn]:
    """A whole scripted conversation through a rollout's base URL: its turns."""
    with openai.OpenAI(base_url=base_url, api_key=token, max_retries=retries, timeout=30) as client:
        turns, _ = converse(client, TURNS, stream=False)
    return turns


FAULT_PLAN = [{"steps": [1], "times": 1, "fault": {"kind": "status", "status_code": 529}}]
"""A 529 at the second step, once (the agent's second attempt is served)."""


Register = Callable[..., tuple[int, Any]]
"""The `register` fixture's call: ``(trajectory, token, *, controller_token=, replay=, plan=)``."""


@pytest.fixture
def register(shared_proxy: Service, scripted_model: Service) -> Register:
    """`register_rollout` on the shared proxy: a rollout recording into `trajectory`, live on the
    scripted model unless it replays ``replay=`` (strictly; ``plan=`` as there), its controller
    token ``<token>-c`` unless given; (status, answer body)."""

    def call(
        trajectory: Path, token: str, *, controller_token: str | None = None, **more: Any
    ) -> tuple[int, Any]:
        upstream = None if more.get("replay") is not None else scripted_model.base_url
        controller = controller_token or f"{token}-c"
        return register_rollout(
            shared_proxy, trajectory, token=token, controller_token=controller, upstream=upstream, **more
        )

    return call


def added(registered: tuple[int, Any]) -> Any:
    """The answer of a `register` call that must have been accepted (its ``base_url``, ``rollout_id``)."""
    code, answer = registered
    assert code == 200, answer
    return answer


def test_concurrent_rollouts_record_and_replay_as_if_alone(
    register: Register, recording: Recording, tmp_path: Path
) -> None:
    # Alone: a recording with a fault plan, then a strict replay of the module's recording.
    solo = tmp_path / "solo"
    solo.mkdir()
    solo_added = added(register(solo / "record.jsonl", "solo", plan=FAULT_PLAN))
    solo_turns = conversation(solo_added["base_url"], "solo", retries=1)
    solo_replay = added(register(solo / "replay.jsonl", "solo-r", replay=recording.path))
    assert conversation(solo_replay["base_url"], "solo-r") == recording.turns

    # Together: the same two at once, interleaved in one process.
    both = tmp_path / "both"
    both.mkdir()
    recorder = added(register(both / "record.jsonl", "a", plan=FAULT_PLAN))
    replayer = added(register(both / "replay.jsonl", "b", replay=recording.path))
    results: dict[str, list[Any]] = {}
    threads = [
        threading.Thread(
            target=lambda: results.__setitem__("a", conversation(recorder["base_url"], "a", retries=1))
        ),
        threading.Thread(target=lambda: results.__setitem__("b", conversation(replayer["base_url"], "b"))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {"a": solo_turns, "b": recording.turns}
    assert [stable(line) for line in lines(both / "record.jsonl")] == [
        stable(line) for line in lines(solo / "record.jsonl")
    ]
    assert [stable(line) for line in lines(both / "replay.jsonl")] == [
        stable(line) for line in lines(solo / "replay.jsonl")
    ]
    assert any(line["metadata"]["fault"] for line in lines(both / "record.jsonl"))  # the plan was applied
    assert not any(line["metadata"]["fault"] for line in lines(both / "replay.jsonl"))  # to its rollout only


def test_each_token_opens_its_own_rollout_only(register: Register, tmp_path: Path) -> None:
    first = added(register(tmp_path / "1.jsonl", "t1", controller_token="c1"))
    second = added(register(tmp_path / "2.jsonl", "t2", controller_token="c2"))
    conversation(first["base_url"], "t1")
    root = first["base_url"].removesuffix("/v1")
    code, _, status = http_json("GET", root + "/_reroll/status", headers={"Authorization": "Bearer c1"})
    assert code == 200 and status["served_live"] == TURNS
    other = second["base_url"].removesuffix("/v1")
    code, _, status = http_json("GET", other + "/_reroll/status", headers={"Authorization": "Bearer c2"})
    assert code == 200 and status["served_live"] == 0  # the second rollout's own counters
    assert http_json("GET", root + "/_reroll/status", headers={"Authorization": "Bearer t1"})[0] == 403
    assert http_json("GET", root + "/_reroll/rollouts", headers={"Authorization": "Bearer c1"})[0] in (
        401,
        405,
    )
    code, _, _ = http_json(
        "POST", root + "/_reroll/rollouts", {"config": {}}, headers={"Authorization": "Bearer c1"}
    )
    assert code == 401  # a controller token does not open the host's admin routes
    code, _, _ = http_json("POST", root + SCRIPTS_ROUTE, {"script": "s.yaml"}, {"Authorization": "Bearer c1"})
    assert code == 401  # nor the scripted model's
    code, _, _ = http_json(
        "DELETE", root + f"/_reroll/rollouts/{second['rollout_id']}", headers={"Authorization": "Bearer t1"}
    )
    assert code == 401
    with pytest.raises(openai.AuthenticationError):  # a token opens its own rollout's site only
        conversation(second["base_url"], "t1")
    assert http_json("GET", other + "/_reroll/status", headers={"Authorization": "Bearer c1"})[0] == 401
    assert lines(tmp_path / "2.jsonl") == []
    # Removed: its tokens open nothing any more, and the other rollout is still served.
    url = root + f"/_reroll/rollouts/{first['rollout_id']}"
    with urllib.request.urlopen(urllib.request.Request(url, method="DELETE", headers=admin())) as done:
        assert done.status == 204
    with pytest.raises(openai.APIConnectionError):  # its own site is closed with it
        conversation(first["base_url"], "t1")
    assert http_json("GET", other + "/_reroll/status", headers={"Authorization": "Bearer c1"})[0] == 401
    assert len(conversation(second["base_url"], "t2")) == TURNS


def test_a_rollout_with_a_corrupt_recording_is_refused_alone(register: Register, tmp_path: Path) -> None:
    healthy = added(register(tmp_path / "ok.jsonl", "ok"))
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"request": {"not": "an exchange"}}\n{"also": "bad"}\n')
    code, answer = register(tmp_path / "out.jsonl", "bad", replay=corrupt)
    assert code == 400 and str(corrupt) in answer["error"]
    code, answer = register(tmp_path / "dup.jsonl", "ok", controller_token="dup-c")
    assert code == 400 and "already served" in answer["error"]  # a token is never shared by two rollouts
    assert len(conversation(healthy["base_url"], "ok")) == TURNS


def test_the_admin_routes_need_the_admin_token(shared_proxy: Service, tmp_path: Path) -> None:
    root = shared_proxy.base_url.removesuffix("/v1")
    body = {"config": {"token": "x", "trajectory_path": str(tmp_path / "x.jsonl")}, "controller_token": "y"}
    assert http_json("POST", root + "/_reroll/rollouts", body)[0] == 401
    assert http_json("POST", root + "/_reroll/rollouts", body, admin("wrong"))[0] == 401
    assert not (tmp_path / "x.jsonl").exists()
    assert http_json("POST", root + "/_reroll/rollouts", {"config": "junk"}, admin())[0] == 400
    script = {"script": str(tmp_path / "missing.yaml")}  # the scripted model's, the same way
    assert http_json("POST", root + SCRIPTS_ROUTE, script)[0] == 401
    assert http_json("POST", root + SCRIPTS_ROUTE, script, admin("wrong"))[0] == 401
    code, _, refused = http_json("POST", root + SCRIPTS_ROUTE, script, admin())
    assert code == 400 and "missing.yaml" in refused["error"]


def test_shared_mode_needs_an_admin_token() -> None:
    os.environ.pop("REROLL_TEST_UNSET_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "reroll_proxy", "--shared", "--admin-token-env", "REROLL_TEST_UNSET_TOKEN"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "--admin-token-env" in done.stderr
