"""The verifier seam: what scores a rollout, chosen by the task's ``verifier.type``.

A verifier is a class implementing `Verifier`, registered in `VERIFIERS` under the name a
task's ``verifier.type`` gives (``test-script``, the default:
`reroll.rollout.verify.script_verifier.TestScriptVerifier`, which runs the task's ``test.sh``;
``llm-judge``: `reroll.rollout.verify.judge.LlmJudgeVerifier`, a model over the task's rubric;
``agent-judge``: `reroll.rollout.verify.input_judge.agent_judge_verifier`, BenchFlow's one judge
call over declared inputs prompted by a role section, or (with ``agent``) an agent in a sandbox
of its own over a read-only copy of the workspace; ``reward-kit``:
`reroll.rollout.verify.reward_kit.RewardKitVerifier`, BenchFlow's Reward Kit runner;
``ors-episode``: `reroll.rollout.verify.ors_episode.OrsEpisodeVerifier`, the terminal reward of
declared ORS reward records), or
named by the dotted path of a class outside reroll (``mypackage.judges:Judge``). `verifier_for`
makes the rollout's one from its task: the class is called with the task and the task's
``verifier.options``. The rollout (`reroll.rollout.lifecycle`)
then calls `Verifier.prepare` once, after the agent is installed and before it runs, and
`Verifier.verify` once after the agent phase (every process of the agent killed, the workspace
hashed); the turn scheduler (`reroll.rollout.turns.scenes`) calls `verify` with ``soft=True`` after
each round of a scene a User drives, while the agent goes on working in the same sandbox.

What a verifier gets (`VerifyRequest`): the started sandbox (run commands in it, read and write
its files; ``sandbox.layout.logs_dir`` holds the agent's logs in it), the base environment of
its processes, the run folder on the host (``agent/output.log``: the agent's output;
``trajectory/llm_trajectory.jsonl``: every LLM exchange; ``prompts.json``: every prompt sent —
what an LLM or agent judge reads) and the host folder for its own files. What it returns
(`Verdict`): rewards by name, a status, on failure the error category and message, what it
said (for a User and for people) and verifier-specific details.

A verification that fails (no reward file, a script that timed out, a judge that answered
nothing usable) is a `Verdict` with status ``error``, never an exception: the rollout records
its category and message in result.json, a User's round gets it as ``verifier_error``. An
exception is for what ends the rollout whatever it scored: the sandbox died (`SandboxError`),
the agent's processes outlived the quiesce (`QuiesceError`), a soft verify left what cannot be
undone.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel
from reroll_contracts.errors import ErrorCategory, TaskError
from reroll_contracts.reward import VerifyResult

from reroll.sandbox.base import Sandbox
from reroll.tasks.task import Task

DEFAULT_VERIFIER = "test-script"
"""The ``verifier.type`` of a task that names none."""


@dataclass(frozen=True)
class Verdict:
    """What a verifier found."""

    rewards: dict[str, float]
    """Rewards by name: ``{"reward": 1.0}`` for a test script's reward.txt, reward.json's object
    as it is; empty when `status` is ``error``."""
    duration_seconds: float
    """How long verifying took, in seconds."""
    status: Literal["ok", "error"] = "ok"
    """``ok``: `rewards` is the score; ``error``: the verifier could not score (see `error`)."""
    error_category: ErrorCategory | None = None
    """With status ``error``: result.json's ``error_category`` (``verifier_error``; a judge whose
    model could not be reached says ``infrastructure``, which a job retries)."""
    error: str = ""
    """With status ``error``: why, for result.json's ``error`` (names the file or the cause)."""
    output: str = ""
    """What the verifier said, as text: a test script's stdout then stderr (the end of each), a
    judge's reasoning. A User's ``RoundResult.verifier_output``."""
    details: dict[str, Any] = field(default_factory=dict)
    """Verifier-specific facts, JSON-able (a test script's reward file and pytest report)."""
    result: VerifyResult | None = None
    """The structured result (items, events, space, granularity) when the verifier graded more
    than one number: a judge's rubric items, a structured ``reward.json``; `rewards` is then its
    `VerifyResult.flat` form. result.json's ``verify_result``."""


@dataclass(frozen=True)
class VerifyRequest:
    """What a verifier gets to score one state of the workspace."""

    sandbox: Sandbox
    """The started sandbox; after the agent phase no process of the agent is left in it, unless
    `keep_agent_processes`."""
    env: dict[str, str]
    """The base environment of sandbox processes (PATH, locale, layout, the task's environment.env)."""
    run_dir: Path
    """The run folder on the host: ``agent/output.log``, ``trajectory/llm_trajectory.jsonl``,
    ``prompts.json``, ``trial.json`` so far."""
    output_dir: Path
    """The host folder for the verifier's own files: the run folder's ``verifier/``, or
    ``verifier/rounds/<turn>/`` for a soft verify. Created by the verifier when it writes."""
    judge_model: str | None = None
    """The judge model a judge uses over the task's (``--judge-model``, config.json's ``judge_model``)."""
    judge_replay: Path | None = None
    """A recorded judge trajectory a judge serves its answers from instead of a live model
    (``reroll rescore`` without ``--judge-model``)."""
    soft: bool = False
    """Between two rounds of a trial: the agent goes on working afterwards, so the verifier must
    leave the workspace as it found it and leave nothing of the hidden tests behind."""
    keep_agent_processes: bool = False
    """The processes the agent left running are still alive (`reroll.rollout.verify.script_verifier.
    keeps_agent_processes`): the test script runs beside them; any other verifier kills them first."""
    sandbox_settings: BaseModel | None = None
    """The rollout's sandbox backend settings (``RolloutSettings.sandbox_config``, an instance of
    the backend's config model), which a judge's sandbox of its own takes; None: the defaults."""


class Verifier(Protocol):
    """Scores a rollout's workspace; made per rollout by a `VerifierFactory` from its task.

    The factory (usually the class itself) is called as ``factory(task, options)``, `options`
    being the task's ``verifier.options``; it raises `TaskError` for options it does not take.
    """

    async def prepare(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        """Record what `verify` needs before the agent runs (a baseline of the sandbox).

        Args:
            sandbox: the started sandbox, agents installed, none run yet.
            env: the base environment of sandbox processes.

        Raises:
            SandboxError: the sandbox failed or died.
        """
        ...

    async def verify(self, request: VerifyRequest) -> Verdict:
        """Score the workspace `request.sandbox` holds (see `VerifyRequest`).

        Returns:
            The verdict; a verification that failed is status ``error`` with its category and message.

        Raises:
            SandboxError: the sandbox failed or died (an infrastructure error).
            RerollError: something that must end the rollout whatever the score (the module docstring).
        """
        ...


VerifierFactory = Callable[[Task, Mapping[str, Any]], Verifier]
"""A `Verifier` class, or anything called the same way: ``(task, options) -> Verifier``."""

VERIFIERS: dict[str, str] = {
    DEFAULT_VERIFIER: "reroll.rollout.verify.script_verifier:TestScriptVerifier",
    "llm-judge": "reroll.rollout.verify.judge:LlmJudgeVerifier",
    "agent-judge": "reroll.rollout.verify.input_judge:agent_judge_verifier",
    "reward-kit": "reroll.rollout.verify.reward_kit:RewardKitVerifier",
    "ors-episode": "reroll.rollout.verify.ors_episode:OrsEpisodeVerifier",
}
"""``verifier.type`` → the ``module:attribute`` of its factory, imported on first use."""


def load_verifier(name: str, where: str = "") -> VerifierFactory:
    """The verifier factory `name` names.

    Args:
        name: a key of `VERIFIERS`, or the dotted path of a class outside reroll
            (``package.module:Class``).
        where: what to name in an error (the task), e.g. ``"task hello-file (/tasks/hello-file)"``.

    Raises:
        TaskError: `name` is not in `VERIFIERS` and not a dotted path, or its module or
            attribute cannot be imported (a `ConfigError`: the CLI exits with code 2).
    """
    prefix = f"{where}: " if where else ""
    target = VERIFIERS.get(name)
    if target is None:
        if ":" not in name:
            raise TaskError(
                f"{prefix}unknown verifier.type {name!r}; known: {', '.join(sorted(VERIFIERS))}, "
                "or the dotted path of a class (package.module:Class)"
            )
        target = name
    module_name, _, attribute = target.partition(":")
    try:
        factory: VerifierFactory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise TaskError(f"{prefix}verifier.type {name!r}: cannot import {target} ({exc})") from exc
    return factory


def verifier_for(task: Task) -> Verifier:
    """The verifier of `task`: its ``verifier.type`` (`load_verifier`) made with its ``verifier.options``.

    Raises:
        TaskError: the type is unknown or cannot be imported, or it refuses the options (the
            message names the task).
    """
    section = task.spec.verifier
    return load_verifier(section.type, f"task {task.name} ({task.path})")(task, section.options)
