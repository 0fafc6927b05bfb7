"""mini-swe-agent (real, from PyPI) under HTTP faults injected by the proxy: a 429 burst, a cut
response and a connection reset (the plans in examples/faults/). Each recorded run is cut by its
step limit before the task's third turn; the folder must load with its fault lines, and
`reroll continue` must replay the faults where they happened and finish the task live.

What the faults did to mini-swe-agent 2.4.6 (litellm 1.80 -> openai SDK): the openai SDK
retried the cut response and the reset at once, silently; it retried a 429 twice after its
Retry-After (1 s), then litellm raised RateLimitError and mini-swe-agent's own retry
("Retrying ... in 4 seconds") got the answer. No crash, no turn lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from reroll.runfolder.run import load_run_folder

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "tasks" / "fix-failing-test"
REROLL = str(Path(sys.executable).parent / "reroll")
PLANS = {"rate-limit-burst": ["status"] * 3, "cut": ["cut"], "reset": ["reset"]}
ANSWERED = 2
"""The task's turns each recording is served before its step limit cuts it (after its faults)."""
"""Plan (examples/faults/NAME.yaml) -> the faults it injects, in order."""
pytestmark = pytest.mark.slow


def reroll_all(commands: dict[str, list[str]], cwd: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run `reroll` commands at once; each must end within 600 s."""
    started = {
        name: subprocess.Popen(
            [REROLL, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, args in commands.items()
    }
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=600)
        print(name, stdout, stderr, sep="\n")
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return done


def only_folder(path: Path) -> Path:
    (folder,) = [p for p in path.iterdir() if p.is_dir()]
    return folder


def lines(folder: Path) -> list[dict[str, Any]]:
    text = (folder / "trajectory" / "llm_trajectory.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Holds the task's script without its delays (fast.yaml)."""
    path = tmp_path_factory.mktemp("faults-main-job")
    script = yaml.safe_load((TASK / "scripted-model.yaml").read_text())
    for turn in script["turns"]:
        turn.pop("delay_seconds", None)
    (path / "fast.yaml").write_text(yaml.safe_dump(script))
    return path


@pytest.fixture(scope="module")
def faulted_runs(workdir: Path) -> dict[str, Path]:
    """One recorded run per plan, all at once; each cut by its step limit (its faults and
    `ANSWERED` turns) before turn 3."""
    commands = {
        plan: [
            *("run", str(TASK), "--agent", "mini-swe-agent", "--model", f"scripted:{workdir / 'fast.yaml'}"),
            *("--max-steps", str(len(PLANS[plan]) + ANSWERED), "--jobs-dir", "jobs", "--job-name", plan),
            *("--faults", str(ROOT / "examples" / "faults" / f"{plan}.yaml")),
        ]
        for plan in PLANS
    }
    for plan, done in reroll_all(commands, workdir).items():
        assert done.returncode == 0, (plan, done.stderr)
    return {plan: only_folder(workdir / "jobs" / plan) for plan in PLANS}


@pytest.fixture(scope="module")
def continued(workdir: Path, faulted_runs: dict[str, Path]) -> dict[str, Path]:
    """`reroll continue` of each faulted run, all at once, live with the fast script after the cut."""
    commands = {
        plan: [
            *("continue", str(folder), "--model", f"scripted:{workdir / 'fast.yaml'}", "--timeout", "120"),
            *("--output", str(workdir / "continued" / plan), "--strict-divergence"),
        ]
        for plan, folder in faulted_runs.items()
    }
    for plan, done in reroll_all(commands, workdir).items():
        assert done.returncode == 0, (plan, done.stderr)
    return {plan: only_folder(workdir / "continued" / plan) for plan in PLANS}


@pytest.mark.parametrize("plan", PLANS)
def test_faulted_recording_is_well_formed(faulted_runs: dict[str, Path], plan: str) -> None:
    folder = load_run_folder(faulted_runs[plan])
    assert folder.result is not None and folder.result.status == "timeout"
    assert folder.trajectory.warning is None
    recorded = [e.metadata.fault.spec.kind for e in folder.exchanges if e.metadata.fault is not None]
    assert recorded == PLANS[plan]
    assert [e.metadata.step for e in folder.exchanges] == list(range(len(folder.exchanges)))
    # the agent retried each fault and got its two fast answers: the faults cost it no turn
    answered = [e for e in folder.exchanges if e.metadata.fault is None]
    assert len(answered) == ANSWERED and all(e.response.status_code == 200 for e in answered)
    faults = json.loads((faulted_runs[plan] / "config.json").read_text())["faults"]
    assert faults == {"plan_path": str(ROOT / "examples" / "faults" / f"{plan}.yaml"), "seed": 0}


@pytest.mark.parametrize("plan", PLANS)
def test_continue_of_a_faulted_run_replays_its_faults_and_finishes(
    faulted_runs: dict[str, Path], continued: dict[str, Path], plan: str
) -> None:
    original = lines(faulted_runs[plan])
    result = json.loads((continued[plan] / "result.json").read_text())
    assert result["status"] == "ok" and result["rewards"] == {"reward": 1.0}
    assert result["counts"]["replayed"] == len(original) and result["counts"]["divergences"] == 0
    stitched = lines(continued[plan])
    replayed = stitched[: len(original)]
    assert [line["metadata"]["source"] for line in replayed] == ["replayed"] * len(original)
    assert [line["response"]["status_code"] for line in replayed] == [
        line["response"]["status_code"] for line in original
    ]
    faults = [line["metadata"]["fault"] for line in replayed if line["metadata"]["fault"]]
    assert [fault["spec"]["kind"] for fault in faults] == PLANS[plan]
    assert all(fault["replayed"] for fault in faults)
    assert json.loads((continued[plan] / "config.json").read_text())["faults"] is None
