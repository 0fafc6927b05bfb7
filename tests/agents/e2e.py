"""The end-to-end flow every real agent's test module runs (one module per agent, once per
sandbox): record until the step limit → ``reroll continue`` to reward 1.0 → ``reroll replay``
matches every step with the same workspace, its rebuild serving every recorded step in order
from the recording and none live → a tampered observation in the recording is caught at its step
and field (in process: the proxy's engine with ``--on-divergence strict``, fed the recording).
The replay is the one run of the agent after the continuation: its fidelity report and its
rebuilt run folder are checked by separate tests.

A module names its agent (``AGENT``), defines its ``recorded`` fixture (`record_until_cut`
with its script's cut turn) and imports the shared fixtures and tests below by name
(``from tests.agents.e2e import *``: `__all__`); a test it defines under the same name replaces
the shared one. ``TAMPERED_OBSERVATION`` (step, text, replacement) overrides
`TAMPERED_OBSERVATION` below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reroll.agents import get_agent
from reroll.runfolder.run import TRAJECTORY
from reroll_contracts.proxy import Divergence
from reroll_contracts.trajectory import load_trajectory
from reroll_proxy.engine import Abort, Replay, ReplayEngine
from reroll_proxy.volatile import Volatility

from tests.e2e.test_main_job import only_folder, read_json, reroll, trajectory

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "fix-failing-test"
__all__ = [
    "continued",
    "replayed",
    "test_a_tampered_observation_is_caught_at_its_step_and_field",
    "test_replay_matches_every_step_and_the_workspace",
    "test_the_replay_serves_every_recorded_step_in_order",
    "workdir",
]
"""The shared fixtures and tests every agent's module imports."""
TAMPERED_OBSERVATION = (1, "def mean", "def median")
"""(step, text, replacement) of the shared tampered-observation test: in every agent's script
step 0 looks at calc.py, so step 1's request ends with its text."""


@pytest.fixture(scope="module")
def workdir(
    tmp_path_factory: pytest.TempPathFactory, sandbox_backend: str, request: pytest.FixtureRequest
) -> Path:
    """The module's folder for its runs, one per agent and sandbox."""
    return tmp_path_factory.mktemp(f"{request.module.AGENT}-{sandbox_backend}")


@pytest.fixture(scope="module")
def continued(recorded: Path, workdir: Path) -> Path:
    """The module's recording continued live to its end (`continue_live`)."""
    return continue_live(recorded, workdir)


@pytest.fixture(scope="module")
def replayed(continued: Path, workdir: Path) -> dict[str, Any]:
    """``reroll replay`` of the module's continuation, once: its fidelity report (`replay_report`;
    ``rebuilt`` names the rebuilt run folder)."""
    return replay_report(continued, workdir)


def test_replay_matches_every_step_and_the_workspace(replayed: dict[str, Any], continued: Path) -> None:
    assert len(replayed["steps"]) == len(trajectory(continued))


def test_the_replay_serves_every_recorded_step_in_order(replayed: dict[str, Any], continued: Path) -> None:
    served_in_order(continued, Path(replayed["rebuilt"]))


def test_a_tampered_observation_is_caught_at_its_step_and_field(
    continued: Path, request: pytest.FixtureRequest
) -> None:
    step, text, replacement = getattr(request.module, "TAMPERED_OBSERVATION", TAMPERED_OBSERVATION)
    divergence = tampered_divergence(continued, step, replace_in_last_observation(text, replacement))
    assert divergence.classification == "observation_changed"
    assert divergence.field.startswith("messages[") and replacement in divergence.diff


def record_until_cut(workdir: Path, sandbox: str, agent: str, cut: int) -> Path:
    """Record `agent` on the task with its own script, cut by ``--max-steps`` before its turn
    `cut` (the run ends ``timeout``, category ``step_limit``, as soon as the agent asks for it).
    Returns the run folder."""
    done = reroll(
        "run", str(TASK), "--agent", agent, "--model", f"scripted:{TASK / f'scripted-model.{agent}.yaml'}",
        "--max-steps", str(cut), "--timeout", "600", "--jobs-dir", "jobs", "--job-name", "record",
        "--sandbox", sandbox, cwd=workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = only_folder(workdir / "jobs" / "record")
    result = read_json(recorded / "result.json")
    assert (result["status"], result["error_category"]) == ("timeout", "step_limit"), result
    return recorded


def continue_live(recorded: Path, workdir: Path) -> Path:
    """``reroll continue`` with the task's own script for the agent; returns the new run folder."""
    done = reroll("continue", str(recorded), "--model", "scripted", "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return only_folder(recorded.parent / "continued")


def replay_report(continued: Path, workdir: Path) -> dict[str, Any]:
    """``reroll replay`` of `continued`: its fidelity.json, after checking the verdict is faithful."""
    done = reroll("replay", str(continued), "--timeout", "300", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = read_json(only_folder(continued.parent / "replayed") / "fidelity.json")
    assert report["faithful"] and report["workspace"]["equal"], report
    assert {step["verdict"] for step in report["steps"]} == {"match"}
    return report


def served_in_order(continued: Path, rebuilt: Path) -> list[dict[str, Any]]:
    """Check that `rebuilt` (``reroll replay``'s rebuild of `continued`) was served every recorded
    step from the recording, in order, without a divergence and with nothing live. Returns the
    rebuilt trajectory."""
    recorded = len(trajectory(continued))
    result = read_json(rebuilt / "result.json")
    assert (
        result["counts"].items()
        >= {"exchanges": recorded, "replayed": recorded, "live": 0, "divergences": 0}.items()
    )
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
