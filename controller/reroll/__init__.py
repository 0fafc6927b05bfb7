"""reroll: run unmodified LLM agents in sandboxes, record every LLM exchange, replay and continue runs.

The Python API (every function is a coroutine; run it with ``asyncio.run``)::

    import asyncio
    from pathlib import Path

    import reroll

    recorded = asyncio.run(reroll.run_task(Path("examples/tasks/fix-failing-test"),
                                           agent_name="mini-swe-agent", model="scripted",
                                           options=reroll.RolloutSettings(timeout_seconds=120)))
    # replay the first half of the recorded exchanges, then continue with another model
    continued = asyncio.run(reroll.continue_run(recorded.run_dir, at=0.5, model="scripted:other.yaml"))
    # is the recording faithfully replayable?
    report = asyncio.run(reroll.replay_run(recorded.run_dir))
    assert report.faithful
    # 4 continuations per model from step 2: the mean reward per model is the value estimate
    summary = asyncio.run(reroll.branch(recorded.run_dir, at=2, models=["scripted", "scripted:b.yaml"], n=4))
    print([(m.model, m.mean_reward) for m in summary.models])

- `run_task` — record a rollout (``reroll run``); returns a `RolloutOutcome` (run folder, result).
  With ``trial=TrialConfig(scenes=[Scene(...), ...])`` (or `load_trial` of a trial file) it runs
  several scenes, roles, turns and User-driven rounds in one sandbox (`reroll.trials.config`)::

      trial = reroll.TrialConfig(scenes=[
          reroll.Scene("prep", [reroll.Role("gen", "mini-swe-agent")],
                       [reroll.Turn("gen", "Write a skill to /app/skill.md")]),
          reroll.Scene.single("mini-swe-agent", name="solve")])
      asyncio.run(reroll.run_task(task, model="scripted", trial=trial))
- `continue_run` — continue a recorded run, from its end or from checkpoint ``at`` (a step index
  or a fraction), with its model or another (``reroll continue``); returns a `RolloutOutcome`.
- `replay_run` — rebuild a run by replay only and check its fidelity (``reroll replay``);
  returns a `FidelityReport`.
- `branch` — N continuations per model from one checkpoint, concurrently (``reroll branch``);
  returns a `BranchSummary`.

All four go through one path, `reroll.rollout.start.start_rollout` (a recording starts from a
task, the others from a `reroll.rollout.checkpoint.Checkpoint`). Each takes ``options=RolloutSettings(...)``
(timeout_seconds, sandbox and its settings sandbox_config, network, faults, divergence_policy) and
``console=rich.console.Console()`` to show progress (default: ``harness/controller.log`` in the
new run folder), and raises a `reroll_contracts.errors.ConfigError` on bad input, before anything is
written; a rollout's own failure is its result (status ``error`` and an ``error_category``), never
an exception. The submodules are imported on first use, so ``import reroll`` stays light (the
proxy and the sidecar import `reroll_contracts.errors` alone).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from reroll.host.forking import keep_grpc_out_of_forks

__version__ = "0.1.0"

keep_grpc_out_of_forks()  # before anything of reroll loads gRPC: see reroll.host.forking

if TYPE_CHECKING:
    from reroll.jobs.branch import branch
    from reroll.rollout.commands.continue_ import continue_run
    from reroll.rollout.commands.record import run_task
    from reroll.rollout.commands.replay import FidelityReport, replay_run
    from reroll.rollout.start import RolloutOutcome
    from reroll.runfolder.summary import BranchSummary
    from reroll.settings import RolloutSettings
    from reroll.trials.config import Role, Scene, TrialConfig, Turn, load_trial
    from reroll.trials.users import BaseUser, FunctionUser, RoundResult, user_spec

_API = {
    "run_task": "reroll.rollout.commands.record",
    "continue_run": "reroll.rollout.commands.continue_",
    "RolloutSettings": "reroll.settings",
    "RolloutOutcome": "reroll.rollout.start",
    "replay_run": "reroll.rollout.commands.replay",
    "FidelityReport": "reroll.rollout.commands.replay",
    "branch": "reroll.jobs.branch",
    "BranchSummary": "reroll.jobs.branch",
    "TrialConfig": "reroll.trials.config",
    "Scene": "reroll.trials.config",
    "Role": "reroll.trials.config",
    "Turn": "reroll.trials.config",
    "load_trial": "reroll.trials.config",
    "BaseUser": "reroll.trials.users",
    "FunctionUser": "reroll.trials.users",
    "RoundResult": "reroll.trials.users",
    "user_spec": "reroll.trials.users",
}
__all__ = [
    "BaseUser",
    "BranchSummary",
    "FidelityReport",
    "FunctionUser",
    "Role",
    "RolloutOutcome",
    "RolloutSettings",
    "RoundResult",
    "Scene",
    "TrialConfig",
    "Turn",
    "branch",
    "continue_run",
    "load_trial",
    "replay_run",
    "run_task",
    "user_spec",
]


def __getattr__(name: str) -> Any:
    """Import the public API's functions and classes lazily (PEP 562)."""
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'reroll' has no attribute {name!r}")
