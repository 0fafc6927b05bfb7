"""litellm as a client of the real proxy (record, then replay) in every API format, run as a
subprocess (`tests.proxy.litellm_client`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.proxy.conftest import TOKEN, Service, StartProxy, start_service
from tests.proxy.test_formats import SCRIPT, TURNS

CLIENT = Path(__file__).with_name("litellm_client.py")
CLIENT_TIMEOUT_SECONDS = 120
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def litellm_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The scripted model serving the formats tests' script."""
    workdir = tmp_path_factory.mktemp("litellm-model")
    (workdir / "script.json").write_text(json.dumps(SCRIPT))
    service = start_service(
        "reroll_proxy.scripted", ["--script", str(workdir / "script.json")], workdir, "model"
    )
    yield service
    service.stop()


def run_client(api_format: str, base_url: str) -> list[dict[str, Any]]:
    """The turns litellm received: the non-streamed loop's, then the streamed loop's."""
    done = subprocess.run(
        [sys.executable, str(CLIENT), api_format, base_url, TOKEN, str(TURNS)],
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("api_format", ["openai-chat", "openai-responses", "anthropic-messages"])
def test_litellm_records_and_replays(
    start_proxy: StartProxy, litellm_model: Service, api_format: str
) -> None:
    recorder = start_proxy(upstream_url=litellm_model.base_url)
    recorded = run_client(api_format, recorder.base_url)
    assert [turn["content"] for turn in recorded] == [
        SCRIPT["turns"][0]["content"],
        "",
        "Done. Everything is in order.",
    ] * 2
    assert [len(turn["tool_calls"]) for turn in recorded] == [1, 2, 0] * 2
    lines = recorder.lines()
    assert [(line["metadata"]["api_format"], line["metadata"]["stream"]) for line in lines] == [
        (api_format, False)
    ] * TURNS + [(api_format, True)] * TURNS
    recorder.service.stop()

    replayer = start_proxy(replay_path=recorder.trajectory_path, policy="strict")
    assert run_client(api_format, replayer.base_url) == recorded
    status = replayer.status()
    assert (status.served_replayed, status.divergences, status.stop) == (2 * TURNS, [], None)
