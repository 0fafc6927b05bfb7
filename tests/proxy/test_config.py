"""Proxy configuration: files, key indirection, and what start_proxy refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from reroll_contracts.errors import ProxyConfigError
from reroll_contracts.proxy import ProxyConfig, ReadyFile, ReplayConfig, UpstreamConfig
from reroll_proxy.config import load_config
from reroll_proxy.server import start_proxy


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_api_key_env_is_resolved_and_hidden(tmp_path: Path) -> None:
    upstream = {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "MY_KEY", "model": "m"}
    path = write(tmp_path / "p.json", {"token": "t", "trajectory_path": "x.jsonl", "upstream": upstream})
    config = load_config(path, {"MY_KEY": "sk-secret"})
    assert config.upstream is not None and config.upstream.api_key == "sk-secret"
    assert "sk-secret" not in repr(config) and "'t'" not in repr(config)
    with pytest.raises(ProxyConfigError, match="MY_KEY"):
        load_config(path, {})


def test_controller_token_env_is_resolved_and_never_dumped(tmp_path: Path) -> None:
    fields = {"token": "t", "trajectory_path": "x.jsonl", "controller_token_env": "CTL"}
    path = write(tmp_path / "p.json", fields)
    config = load_config(path, {"CTL": "controller-secret"})
    assert config.controller_token == "controller-secret" and config.controller_token_env == "CTL"
    assert "controller-secret" not in repr(config) and "controller-secret" not in config.model_dump_json()
    assert (
        load_config(write(tmp_path / "q.json", {"token": "t", "trajectory_path": "x"})).controller_token
        is None
    )
    with pytest.raises(ProxyConfigError, match="controller_token_env names 'CTL', which is not set"):
        load_config(path, {})
    with pytest.raises(ProxyConfigError, match="'CTL', which is empty"):
        load_config(path, {"CTL": ""})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not JSON"),
        (json.dumps({"token": "t", "trajectory_path": "x", "colour": 1}), "colour"),
        (json.dumps({"token": "", "trajectory_path": "x"}), "token"),
        (
            json.dumps({"token": "t", "trajectory_path": "x", "replay_timing_factor": -1}),
            "replay_timing_factor",
        ),
        (
            json.dumps({"token": "t", "trajectory_path": "x", "divergence_policy": "loose"}),
            "divergence_policy",
        ),
    ],
)
def test_invalid_files_name_the_file(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ProxyConfigError, match=expected) as caught:
        load_config(path)
    assert str(path) in str(caught.value)


async def test_start_proxy_refuses_nothing_to_serve_and_a_cut_past_the_recording(tmp_path: Path) -> None:
    with pytest.raises(ProxyConfigError, match="neither replay nor upstream"):
        await start_proxy(ProxyConfig(token="t", trajectory_path=tmp_path / "out.jsonl"))
    (tmp_path / "rec.jsonl").write_text("")
    config = ProxyConfig(
        token="t",
        trajectory_path=tmp_path / "out.jsonl",
        replay=ReplayConfig(trajectory_path=tmp_path / "rec.jsonl", cut_index=1),
        upstream=UpstreamConfig(base_url="http://127.0.0.1:1/v1"),
    )
    with pytest.raises(ProxyConfigError, match="cut_index 1 exceeds the 0 exchanges"):
        await start_proxy(config)


async def test_start_proxy_in_process(tmp_path: Path) -> None:
    config = ProxyConfig(
        token="t",
        trajectory_path=tmp_path / "out.jsonl",
        upstream=UpstreamConfig(base_url="http://127.0.0.1:1/v1"),
        ready_file=tmp_path / "ready.json",
    )
    proxy = await start_proxy(config)
    try:
        ready = ReadyFile.model_validate_json((tmp_path / "ready.json").read_bytes())
        assert ready.address == proxy.base_url and proxy.port > 0
        assert proxy.base_url == f"http://127.0.0.1:{proxy.port}/v1"
    finally:
        await proxy.stop()


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("field", "file", "content", "message"),
    [
        ("replay", "rec.jsonl", '{"bad": \n{}\n', "rec.jsonl: line 1"),
        ("faults", "plan.yaml", "rules: [{fault: {kind: nonsense}}]\n", "plan.yaml: invalid fault plan"),
    ],
)
def test_main_exits_2_on_a_corrupt_replay_or_fault_plan(
    tmp_path: Path, field: str, file: str, content: str, message: str
) -> None:
    (tmp_path / file).write_text(content)
    config = {
        "token": "t",
        "trajectory_path": str(tmp_path / "out.jsonl"),
        "upstream": {"base_url": "http://127.0.0.1:9/v1"},
        field: {"trajectory_path" if field == "replay" else "plan_path": str(tmp_path / file)},
    }
    path = write(tmp_path / "p.json", config)
    done = subprocess.run(
        [sys.executable, "-m", "reroll_proxy", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"reroll_proxy: error: {tmp_path / message}" in done.stderr
    assert "Traceback" not in done.stderr
