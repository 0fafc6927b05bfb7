"""The end-to-end flow every real agent's test module runs (one module per agent, once per
sandbox): record until the timeout → ``reroll continue`` to reward 1.0 → ``reroll replay``
matches every step with the same workspace → a strict replay-only rebuild replays every step →
a tampered observation in the recording is caught at its step and field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from reroll.agents import get_agent
from reroll.runfolder import TRAJECTORY
from reroll_proxy.divergence import Divergence
from reroll_proxy.engine import Abort, Replay, ReplayEngine
from reroll_proxy.exchange import load_trajectory
from reroll_proxy.volatile import Volatility

from tests.test_main_job import only_folder, read_json, reroll, trajectory

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"


def record_until_stalled(
    workdir: Path, sandbox: str, agent: str, stall_turn: int, timeout_seconds: float
) -> Path:
    """Record `agent` on the task with its own script, whose turn `stall_turn` never comes in
    time: the run ends by its timeout. Returns the run folder."""
    script = yaml.safe_load((TASK / f"scripted-model.{agent}.yaml").read_text())
    script["turns"][stall_turn]["delay_seconds"] = 3600
    stalling = workdir / f"stall-at-turn-{stall_turn}.yaml"
    stalling.write_text(yaml.safe_dump(script))
    done = reroll(
        "run", str(TASK), "--agent", agent, "--model", f"scripted:{stalling}",
        "--timeout", str(timeout_seconds), "--jobs-dir", "jobs", "--job-name", "record",
        "--sandbox", sandbox, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = only_folder(workdir / "jobs" / "record")
    assert read_json(recorded / "result.json")["status"] == "timeout"
    return recorded


def continue_live(recorded: Path, workdir: Path) -> Path:
    """``reroll continue`` with the task's own script for the agent; returns the new run folder."""
    done = reroll("continue", str(recorded), "--model", "scripted", "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return only_folder(recorded.parent / "continued")


def replay_report(continued: Path, workdir: Path) -> dict:
    """``reroll replay`` of `continued`: its fidelity.json, after checking the verdict is faithful."""
    done = reroll("replay", str(continued), "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    report = read_json(only_folder(continued.parent / "replayed") / "fidelity.json")
    assert report["faithful"] and report["workspace"]["equal"], report
    assert {step["verdict"] for step in report["steps"]} == {"match"}
    return report


def strict_rebuild(continued: Path, workdir: Path) -> list[dict]:
    """A replay-only rebuild of `continued` with ``--on-divergence strict``: every recorded step
    is replayed, in order, without a divergence. Returns the rebuilt trajectory."""
    done = reroll(
        "continue", str(continued), "--replay-only", "--on-divergence", "strict", "--timeout", "300",
        "--output", "strict", cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rebuilt = only_folder(workdir / "strict")
    recorded = len(trajectory(continued))
    result = read_json(rebuilt / "result.json")
    assert result["counts"] == {"exchanges": recorded, "replayed": recorded, "live": 0, "divergences": 0}
    lines = trajectory(rebuilt)
    assert [line["metadata"]["replayed_from"] for line in lines] == list(range(recorded))
    return lines


def tampered_divergence(run: Path, step: int, tamper: Callable[[dict[str, Any]], None]) -> Divergence:
    """What a strict replay meets when the request recorded at `step` of `run` was tampered with
    (`tamper` edits that request's body in place: an observation, say) and the agent sends what
    it sent when recorded: the engine (`reroll_proxy.engine`, in process, with the agent's
    volatile rules) is fed `run`'s requests in recorded order. Checks that every earlier step
    is replayed without a divergence and that `step` is aborted; returns its divergence."""
    exchanges = load_trajectory(run / TRAJECTORY).exchanges
    tampered = [exchange.model_copy(deep=True) for exchange in exchanges]
    tamper(tampered[step].request.body)
    assert tampered[step].request.body != exchanges[step].request.body, "the tamper changed nothing"
    engine = ReplayEngine(
        tampered,
        cut_index=len(tampered),
        has_live_upstream=False,
        divergence_policy="strict",
        volatility=Volatility(get_agent(read_json(run / "config.json")["agent"]).volatile),
    )
    decisions = [engine.decide(e.request.body, e.metadata.api_format) for e in exchanges[: step + 1]]
    assert all(isinstance(d, Replay) and d.divergence is None for d in decisions[:step]), decisions
    aborted = decisions[step]
    assert isinstance(aborted, Abort) and aborted.step == step, aborted
    return aborted.divergence


def replace_in_last_observation(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    """A `tampered_divergence` tamper: `old` → `new` in every string of the request's last
    conversation item (``messages``: Chat Completions, Anthropic Messages; ``input``:
    Responses), which is the observation the agent's last step brought back."""

    def replaced(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(old, new)
        if isinstance(value, list):
            return [replaced(item) for item in value]
        if isinstance(value, dict):
            return {key: replaced(item) for key, item in value.items()}
        return value

    def tamper(body: dict[str, Any]) -> None:
        items = body["messages"] if "messages" in body else body["input"]
        items[-1] = replaced(items[-1])

    return tamper
