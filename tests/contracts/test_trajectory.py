"""The trajectory line format and load_trajectory's tolerance and errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from reroll_contracts import trajectory
from reroll_contracts.errors import RunFolderError, TrajectoryFormatError
from reroll_contracts.trajectory import Exchange, load_trajectory, sanitize_headers


def line(step: int, **extra: Any) -> dict[str, Any]:
    return {
        "request": {
            "timestamp": "2025-01-01T00:00:00+00:00",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": {"content-type": "application/json"},
            "body": {"model": "m", "messages": [{"role": "user", "content": f"step {step}"}]},
        },
        "response": {
            "timestamp": "2025-01-01T00:00:01+00:00",
            "status_code": 200,
            "headers": {},
            "body": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
        },
        "duration_ms": 12.5,
        "metadata": {"step": step, "source": "live", "model": "m"},
        **extra,
    }


def write(path: Path, lines: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in lines) + tail)
    return path


def test_round_trip(tmp_path: Path) -> None:
    exchange = Exchange.model_validate(line(0))
    path = tmp_path / "t.jsonl"
    path.write_bytes(exchange.to_line() * 2)
    loaded = load_trajectory(path)
    assert loaded.exchanges == [exchange, exchange]
    assert (loaded.truncated_line, loaded.warning) == (None, None)
    assert exchange.to_line().endswith(b"\n") and exchange.to_line().count(b"\n") == 1


@pytest.mark.parametrize("extras", [False, True])
def test_a_line_is_pydantics_dump_byte_for_byte(extras: bool) -> None:
    """`Exchange.to_line` serialises bodies and events with orjson directly: the same bytes as
    ``orjson.dumps(model_dump(mode="json"))``, extra fields (BenchFlow's, an event's ``id``) and
    non-JSON values of a body included."""
    raw = line(0, extra_top="kept") if extras else line(0)
    raw["response"]["events"] = [{"data": '{"a": 1}'}, {"event": "done", "data": "[DONE]", "id": "7"}]
    if extras:
        raw["request"]["query"] = {"a": "b"}
        raw["response"]["trailer"] = [1.5, None]
    exchange = Exchange.model_validate(raw)
    exchange.request.body = {"messages": [{"content": "naïve 🚀"}], "tuple": (1, 2), "inf": float("inf")}
    assert exchange.to_line() == orjson.dumps(exchange.model_dump(mode="json")) + b"\n"
    assert exchange.to_line(exchange.request.line_json()) == exchange.to_line()  # the JSON made ahead


def test_benchflow_lines_with_extra_keys_and_no_reroll_metadata_load(tmp_path: Path) -> None:
    benchflow = line(0, extra_top="kept")
    del benchflow["metadata"]
    benchflow["request"]["query"] = {"a": "b"}
    loaded = load_trajectory(write(tmp_path / "t.jsonl", [benchflow]))
    (exchange,) = loaded.exchanges
    assert exchange.metadata.step is None and exchange.metadata.source == "live"
    assert exchange.model_dump(mode="json")["extra_top"] == "kept"
    assert exchange.request.model_dump()["query"] == {"a": "b"}


def test_truncated_last_line_is_ignored_with_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(0), line(1)], tail='{"request": {"timest')
    loaded = load_trajectory(path)
    assert [e.metadata.step for e in loaded.exchanges] == [0, 1]
    assert loaded.truncated_line == 3
    assert loaded.warning is not None and str(path) in loaded.warning and "line 3" in loaded.warning


def test_bad_last_line_with_its_newline_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(0)], tail="{not json\n")
    with pytest.raises(TrajectoryFormatError, match="line 2: invalid JSON"):
        load_trajectory(path)


def test_corrupt_middle_line_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(0)], tail='{"broken": \n' + json.dumps(line(2)) + "\n")
    with pytest.raises(TrajectoryFormatError) as caught:
        load_trajectory(path)
    assert (
        str(path) in str(caught.value)
        and "line 2" in str(caught.value)
        and "invalid JSON" in str(caught.value)
    )


def test_line_that_is_not_an_exchange_names_file_line_and_field(tmp_path: Path) -> None:
    bad = line(1)
    del bad["response"]["status_code"]
    path = write(tmp_path / "t.jsonl", [line(0), bad, line(2)])
    with pytest.raises(TrajectoryFormatError) as caught:
        load_trajectory(path)
    message = str(caught.value)
    assert str(path) in message and "line 2" in message and "response.status_code" in message
    assert isinstance(caught.value, RunFolderError) and caught.value.error_category == "config"


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        load_trajectory(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    assert load_trajectory(tmp_path / "empty.jsonl").exchanges == []


def test_sanitize_headers_drops_secrets() -> None:
    headers = [
        ("Authorization", "Bearer x"),
        ("X-Api-Key", "x"),
        ("api-key", "x"),
        ("Cookie", "c"),
        ("Proxy-Authorization", "p"),
        ("X-Goog-Api-Key", "x"),
        ("X-Session-Token", "t"),
        ("Set-Cookie", "s"),
        ("Content-Type", "application/json"),
        ("User-Agent", "OpenAI/Python"),
    ]
    assert sanitize_headers(headers) == {"content-type": "application/json", "user-agent": "OpenAI/Python"}


@pytest.mark.parametrize("target", ["/dev/zero", "loop"])
def test_a_trajectory_that_is_a_symlink_is_refused_unread(tmp_path: Path, target: str) -> None:
    path = tmp_path / "llm_trajectory.jsonl"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    path.symlink_to(target if target.startswith("/") else tmp_path / target)
    with pytest.raises(TrajectoryFormatError, match=f"{path}: a symlink"):
        load_trajectory(path)


@pytest.mark.timeout(10)
def test_a_trajectory_that_is_a_fifo_is_refused_without_waiting(tmp_path: Path) -> None:
    path = tmp_path / "llm_trajectory.jsonl"
    os.mkfifo(path)
    with pytest.raises(TrajectoryFormatError, match=f"{path}: not a regular file"):
        load_trajectory(path)


def test_a_trajectory_or_a_line_over_its_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path / "t.jsonl", [line(0), line(1)])
    size = path.stat().st_size
    monkeypatch.setattr(trajectory, "MAX_LINE_BYTES", size // 2 - 10)
    with pytest.raises(TrajectoryFormatError, match=rf"{path}: line 1 is larger than {size // 2 - 10} bytes"):
        load_trajectory(path)
    monkeypatch.setattr(trajectory, "MAX_TRAJECTORY_BYTES", size - 1)
    with pytest.raises(
        TrajectoryFormatError, match=rf"{path}: {size} bytes, more than the cap of {size - 1} bytes"
    ):
        load_trajectory(path)
