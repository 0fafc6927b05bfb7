"""The main job end to end with real parts: mini-swe-agent from PyPI, the sidecar, the LLM proxy
and the bundled scripted model, all as real subprocesses of `reroll`, once in the `local`
sandbox and once in `docker` containers (network policy `none`: only the proxy is reachable).

The recording uses a copy of the bundled task's script whose turn 3 never comes in time, so its
timeout (generous, for slow container starts on a loaded machine) always cuts it after two
exchanges; the continuation replays them and finishes live on the bundled script, and is
exported (``reroll export``) to ATIF and to verifiers records.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from atif import Trajectory
from reroll.export.verifiers import RolloutRecord

from tests.conftest import labelled_containers

REROLL = str(Path(sys.executable).parent / "reroll")
TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
RECORD_TIMEOUT_SECONDS = 40
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a first run builds the image, installs the agent


def reroll(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([REROLL, *args], capture_output=True, text=True, cwd=cwd, timeout=900)
    print(done.stdout, done.stderr, sep="\n")
    return done


def only_folder(path: Path) -> Path:
    (folder,) = [p for p in path.iterdir() if p.is_dir() and p.name != "continued"]
    return folder


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def trajectory(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "trajectory" / "llm_trajectory.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, sandbox_backend: str) -> Path:
    return tmp_path_factory.mktemp(f"main-job-{sandbox_backend}")


@pytest.fixture(scope="module")
def timed_out_run(workdir: Path, sandbox_backend: str) -> Path:
    """A recorded mini-swe-agent run cut by its timeout after two exchanges."""
    script = yaml.safe_load((TASK / "scripted-model.yaml").read_text())
    script["turns"][2]["delay_seconds"] = 3600
    stalling = workdir / "stall-at-turn-3.yaml"
    stalling.write_text(yaml.safe_dump(script))
    done = reroll(
        "run",
        str(TASK),
        "--agent",
        "mini-swe-agent",
        "--model",
        f"scripted:{stalling}",
        "--timeout",
        str(RECORD_TIMEOUT_SECONDS),
        "--jobs-dir",
        "jobs",
        "--job-name",
        "record",
        "--sandbox",
        sandbox_backend,
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr
    return only_folder(workdir / "jobs" / "record")


def test_recorded_run_times_out_with_its_exchanges(timed_out_run: Path) -> None:
    result = read_json(timed_out_run / "result.json")
    assert result["status"] == "timeout" and result["error_category"] == "timeout"
    assert result["rewards"] == {"reward": 0.0}
    lines = trajectory(timed_out_run)
    assert len(lines) == 2 == result["counts"]["live"]
    assert [line["metadata"]["source"] for line in lines] == ["live", "live"]
    assert lines[0]["request"]["body"]["messages"][0]["role"] == "system"
    assert "authorization" not in {k.lower() for k in lines[0]["request"]["headers"]}
    config = read_json(timed_out_run / "config.json")
    assert config["agent"] == "mini-swe-agent" and config["timeout_sec"] == RECORD_TIMEOUT_SECONDS
    assert not labelled_containers(timed_out_run.name)


@pytest.fixture(scope="module")
def continued(timed_out_run: Path, workdir: Path) -> Path:
    """`timed_out_run` continued live on the bundled script."""
    done = reroll("continue", str(timed_out_run), "--model", "scripted", "--timeout", "120", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return only_folder(timed_out_run.parent / "continued")


def test_continue_finishes_with_reward_one(timed_out_run: Path, continued: Path) -> None:
    result = read_json(continued / "result.json")
    assert result["status"] == "ok"
    assert result["rewards"] == {"reward": 1.0}
    lines = trajectory(continued)
    sources = [line["metadata"]["source"] for line in lines]
    assert sources == ["replayed", "replayed", "live", "live", "live"]
    assert all(set(line) == set(lines[0]) for line in lines)
    assert all(set(line["response"]) >= {"status_code", "body"} for line in lines)
    original = trajectory(timed_out_run)
    for replayed, recorded in zip(lines[:2], original, strict=False):
        assert replayed["response"]["body"] == recorded["response"]["body"]
    provenance = read_json(continued / "config.json")["continued_from"]
    assert provenance["path"] == str(timed_out_run.resolve())
    assert provenance["status"] == "timeout"
    assert provenance["cut_index"] == 2
    assert provenance["original_model"].endswith("stall-at-turn-3.yaml")
    assert provenance["live_model"] == "scripted"
    assert result["counts"].items() >= {"exchanges": 5, "replayed": 2, "live": 3, "divergences": 0}.items()
    usage = [(line["response"]["body"] or {}).get("usage") or {} for line in lines]
    assert result["counts"]["tokens"] == sum(part.get("total_tokens", 0) for part in usage) > 0
    assert (
        read_json(continued / "config.json")["sandbox"] == read_json(timed_out_run / "config.json")["sandbox"]
    )
    assert not labelled_containers(continued.name)


def test_replay_only_rebuilds_the_same_workspace(timed_out_run: Path, workdir: Path) -> None:
    done = reroll(
        "continue", str(timed_out_run), "--replay-only", "--timeout", "120", "--output", "replay-only",
        cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2 replayed, 0 live" in done.stdout
    rebuilt = only_folder(workdir / "replay-only")
    result = read_json(rebuilt / "result.json")
    assert result["error_category"] == "replay_only"
    assert result["counts"]["replayed"] == 2 and result["counts"]["live"] == 0
    assert result["rewards"] is None
    original_files = read_json(timed_out_run / "workspace_manifest.json")
    assert "calc.py" in original_files
    assert read_json(rebuilt / "workspace_manifest.json") == original_files
    assert read_json(rebuilt / "config.json")["continued_from"]["replay_only"] is True


def test_strict_divergence_aborts_on_a_tampered_observation(timed_out_run: Path, workdir: Path) -> None:
    tampered = workdir / "tampered" / timed_out_run.name
    shutil.copytree(timed_out_run, tampered)
    lines = trajectory(tampered)
    messages = lines[1]["request"]["body"]["messages"]
    observation = next(m for m in reversed(messages) if m["role"] == "tool")
    observation["content"] = observation["content"].replace("def mean", "def median")
    (tampered / "trajectory" / "llm_trajectory.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in lines)
    )
    done = reroll(
        "continue", str(tampered), "--strict-divergence", "--timeout", "120", "--output", "strict",
        cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 1
    assert "divergence" in done.stdout
    aborted = only_folder(workdir / "strict")
    result = read_json(aborted / "result.json")
    assert result["status"] == "error" and result["error_category"] == "divergence"
    assert "step 1" in result["error"]


def test_oracle_solves_a_legacy_task(workdir: Path, sandbox_backend: str) -> None:
    task = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "word-count"
    done = reroll(
        "run",
        str(task),
        "--agent",
        "oracle",
        "--jobs-dir",
        "jobs",
        "--job-name",
        "oracle",
        "--sandbox",
        sandbox_backend,
        cwd=workdir,
    )
    assert done.returncode == 0, done.stderr
    result = read_json(only_folder(workdir / "jobs" / "oracle") / "result.json")
    assert result["status"] == "ok"
    assert result["rewards"] == {"reward": 1.0, "cases_passed": 2.0}


def only_on_local(sandbox_backend: str) -> None:
    """Skip an export on docker: a run folder is the same whatever sandbox wrote it."""
    if sandbox_backend != "local":
        pytest.skip("the export reads the run folder only: checked once, on local")


def test_atif_export_of_the_continued_run(continued: Path, tmp_path: Path, sandbox_backend: str) -> None:
    only_on_local(sandbox_backend)
    out = tmp_path / "trajectory.json"
    done = reroll("export", str(continued), "--format", "atif", "--output", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    exported = Trajectory.model_validate_json(out.read_bytes())
    agent_steps = [step for step in exported.steps if step.source == "agent"]
    assert len(agent_steps) == len(trajectory(continued)) >= 3
    assert exported.steps[0].source == "system"
    assert exported.agent.name == "mini-swe-agent"
    assert exported.extra is not None and exported.extra["reroll"]["rewards"] == {"reward": 1.0}
    assert all(step.metrics is not None for step in agent_steps)
    assert exported.final_metrics is not None and exported.final_metrics.total_steps == len(exported.steps)


def test_verifiers_export_of_the_continued_run(continued: Path, tmp_path: Path, sandbox_backend: str) -> None:
    only_on_local(sandbox_backend)
    done = reroll("export", str(continued), "--format", "verifiers", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    record = RolloutRecord.model_validate(json.loads(line))
    assert record.reward == 1.0 and not record.is_truncated
    assert [m["role"] for m in record.prompt] == ["system", "user"]
    assert record.completion[0]["role"] == "assistant"
    assert record.info["agent"] == "mini-swe-agent" and record.info["status"] == "ok"
