"""The ``reward-kit`` verifier: BenchFlow's Reward Kit runner, scored as a test script's files.

A task whose ``verifier/verifier.md`` selects a ``reward-kit`` strategy
(`reroll.tasks.strategies`) is run as BenchFlow 0.7.x runs it
(``benchflow.task.verifier_core.Verifier._verify_reward_kit``): from the uploaded verifier folder,
``python ROOT/ENTRYPOINT`` (``python3`` where the image has no ``python``; BenchFlow runs
``python`` only), with these variables (paths as the sandbox's processes see them)::

    BENCHFLOW_VERIFIER_DIR          the uploaded verifier folder (/verifier)
    BENCHFLOW_REWARD_KIT_ROOT       its ROOT folder
    BENCHFLOW_REWARD_KIT_CRITERIA   the criteria file (only when the strategy declares one)
    BENCHFLOW_REWARD_KIT_MANIFEST   <logs>/verifier/reward-kit-manifest.json
    BENCHFLOW_REWARD_TEXT / _JSON / _DETAILS_JSON   <logs>/verifier/reward.txt, reward.json,
                                    reward-details.json

and, written before the runner starts, the manifest (`manifest`, version
``benchflow.reward-kit.v1``): the strategy, the paths above, verifier.md's rubric and outputs and
the criteria's aggregate policy. The runner reads it; reroll never reads it back (the run
folder's ``verifier/`` keeps it with the other files the runner left).

Everything else is the test-script verifier's (`reroll.rollout.verify.script_verifier`, which
runs it as a ``verifier.command``): hardening, clean environment, ``verifier.env``,
``verifier.timeout_sec``, run as root, and the reward files read the same way. With a criteria
file the reward is strict, as in BenchFlow: the criteria's policy replaces
``outputs.aggregate_policy``, ``reward.json`` must be written (``reward.txt`` alone is a verifier
error), its items must be exactly the criteria, and a ``reward`` it states must equal the
criteria's aggregate (`check_criteria`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reroll_contracts.errors import VerifierError
from reroll_contracts.graded import AGREEMENT, AggregatePolicy, read_graded

from reroll.rollout.verify.script_verifier import TestScriptVerifier
from reroll.rollout.verify.verifiers import Verdict, VerifyRequest
from reroll.runfolder.paths import VerifierPaths
from reroll.sandbox.base import Sandbox
from reroll.sandbox.layout import SandboxLayout
from reroll.tasks.rubric import document_section
from reroll.tasks.strategies import RewardKitStrategy, reward_kit_strategy
from reroll.tasks.task import Task

MANIFEST_FILE = "reward-kit-manifest.json"
"""The manifest's name, in ``<logs>/verifier``."""
MANIFEST_VERSION = "benchflow.reward-kit.v1"


def sandbox_paths(task: Task, strategy: RewardKitStrategy, layout: SandboxLayout) -> dict[str, str | None]:
    """The manifest's ``paths`` (absolute, as the sandbox's processes see them)."""
    verifier_dir = layout.path(task.verifier_mount)
    logs = f"{layout.logs_dir}/verifier"
    return {
        "verifier_dir": verifier_dir,
        "reward_kit_root": f"{verifier_dir}/{strategy.root}",
        "criteria": None if strategy.criteria is None else f"{verifier_dir}/{strategy.criteria}",
        "reward_text": f"{logs}/reward.txt",
        "reward_json": f"{logs}/reward.json",
        "reward_details_json": f"{logs}/reward-details.json",
    }


def environment(paths: Mapping[str, str | None], manifest_path: str) -> dict[str, str]:
    """The ``BENCHFLOW_*`` variables of the runner (the module docstring)."""
    env = {
        "BENCHFLOW_VERIFIER_DIR": paths["verifier_dir"],
        "BENCHFLOW_REWARD_KIT_ROOT": paths["reward_kit_root"],
        "BENCHFLOW_REWARD_TEXT": paths["reward_text"],
        "BENCHFLOW_REWARD_JSON": paths["reward_json"],
        "BENCHFLOW_REWARD_DETAILS_JSON": paths["reward_details_json"],
        "BENCHFLOW_REWARD_KIT_CRITERIA": paths["criteria"],
        "BENCHFLOW_REWARD_KIT_MANIFEST": manifest_path,
    }
    return {name: value for name, value in env.items() if value is not None}


def manifest(task: Task, strategy: RewardKitStrategy, paths: Mapping[str, str | None]) -> dict[str, Any]:
    """The manifest the runner reads, as BenchFlow builds it (``_reward_kit_manifest_json``):
    ``version``, ``verifier`` (name, document_version, default_strategy), ``strategy`` (name,
    type, root, entrypoint, criteria, config: the strategy's own fields), ``paths``, ``rubric``,
    ``criteria_policy`` and ``outputs`` (verifier.md's, with BenchFlow's defaults).

    Raises:
        TaskError: verifier.md's front matter no longer parses.
    """
    name, config, front = document_section(task.verifier_dir)
    section = front["verifier"] if isinstance(front.get("verifier"), dict) else {}
    outputs = section["outputs"] if isinstance(section.get("outputs"), dict) else {}
    version = front.get("document_version")
    return {
        "version": MANIFEST_VERSION,
        "verifier": {
            "name": str(section.get("name") or task.verifier_dir.name),
            "document_version": None if version is None else str(version),
            "default_strategy": name,
        },
        "strategy": {
            "name": name,
            "type": "reward-kit",
            "root": str(strategy.root),
            "entrypoint": str(strategy.entrypoint),
            "criteria": None if strategy.criteria is None else str(strategy.criteria),
            "config": _jsonable(config),
        },
        "paths": dict(paths),
        "rubric": _jsonable(section.get("rubric") or {}),
        "criteria_policy": strategy.policy,
        "outputs": {
            "reward_text": outputs.get("reward_text") or "/logs/verifier/reward.txt",
            "reward_json": outputs.get("reward_json") or "/logs/verifier/reward.json",
            "details_json": outputs.get("details_json"),
            "aggregate_policy": _jsonable(outputs.get("aggregate_policy") or {}),
            "declared_reward_text": "reward_text" in outputs,
            "declared_reward_json": "reward_json" in outputs,
            "declared_details_json": "details_json" in outputs,
        },
    }


def _jsonable(value: Any) -> Any:
    """`value` with every leaf JSON can hold kept and any other (a YAML date) as its text."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


def runner_command(strategy: RewardKitStrategy, manifest_path: str, manifest_json: str) -> str:
    """The shell command the test-script verifier runs from the verifier folder: replace the
    manifest (``rm -f`` first: whatever the folder held, a link included, is gone), then run the
    runner with ``python`` (``python3`` when there is no ``python``)."""
    target, runner = shlex.quote(manifest_path), shlex.quote(str(strategy.runner))
    return (
        f"rm -f -- {target} && printf '%s\\n' {shlex.quote(manifest_json)} > {target} && "
        f"if command -v python > /dev/null 2>&1 ; then exec python {runner} ; else exec python3 {runner} ; fi"
    )


def check_criteria(output_dir: Path, policy: Mapping[str, Any]) -> None:
    """BenchFlow's strict reading of a runner's reward with declared criteria: ``reward.json``
    must be there (``reward.txt`` alone is not enough), and a ``reward`` it states must equal the
    criteria's aggregate of its items, which must be exactly the criteria (the aggregate computed
    when it states none is already checked so by the test-script verifier).

    Raises:
        VerifierError: naming the file and what is wrong.
    """
    path = VerifierPaths(output_dir).reward_json
    if not path.is_file():
        raise VerifierError(
            f"the reward-kit strategy declares criteria, so its runner must write {path.name} with "
            f"their metrics; it wrote only reward.txt"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or "reward" not in data:
            return
        stated = data["reward"]
        computed = read_graded({k: v for k, v in data.items() if k != "reward"}, _policy(policy), None).reward
    except ValueError as exc:
        raise VerifierError(f"{path}: {exc}") from exc
    if not isinstance(stated, int | float) or abs(float(stated) - computed) > AGREEMENT:
        raise VerifierError(f"{path}: reward={stated!r} does not match the criteria's aggregate {computed:g}")


def _policy(policy: Mapping[str, Any]) -> AggregatePolicy:
    return AggregatePolicy.parse(policy, "the reward-kit criteria's policy")


class RewardKitVerifier:
    """The ``reward-kit`` verifier (`reroll.rollout.verify.verifiers.Verifier`). Options: the
    strategy's fields (``root``, ``entrypoint``, ``criteria``; `reroll.tasks.strategies`)."""

    def __init__(self, task: Task, options: Mapping[str, Any]) -> None:
        """Raises: TaskError: the strategy's fields or files are invalid (`reward_kit_strategy`)."""
        self.task = task
        self.strategy = reward_kit_strategy(dict(options), task.verifier_dir)

    def _script(self, layout: SandboxLayout) -> TestScriptVerifier:
        """The test-script verifier that runs the runner in a sandbox of `layout`."""
        paths = sandbox_paths(self.task, self.strategy, layout)
        manifest_path = f"{layout.logs_dir}/verifier/{MANIFEST_FILE}"
        text = json.dumps(manifest(self.task, self.strategy, paths), indent=2, allow_nan=False)
        section = self.task.spec.verifier.model_copy(
            update={
                "type": "test-script",
                "options": {},
                "command": runner_command(self.strategy, manifest_path, text),
                "env": self.task.spec.verifier.env | environment(paths, manifest_path),
            }
        )
        task = self.task.model_copy(update={"spec": self.task.spec.model_copy(update={"verifier": section})})
        return TestScriptVerifier(task, {})

    async def prepare(self, sandbox: Sandbox, env: dict[str, str]) -> None:
        """The test-script verifier's baseline (`reroll.rollout.verify.script_verifier.prepare`)."""
        await self._script(sandbox.layout).prepare(sandbox, env)

    async def verify(self, request: VerifyRequest) -> Verdict:
        """Run the runner as a test script; with criteria, `check_criteria` too. Failures are
        verdicts with status ``error`` (see `reroll.rollout.verify.verifiers.Verifier.verify`)."""
        started = time.monotonic()
        verdict = await self._script(request.sandbox.layout).verify(request)
        if verdict.status != "ok" or self.strategy.policy is None:
            return verdict
        try:
            check_criteria(request.output_dir, self.strategy.policy)
        except VerifierError as exc:
            return dataclasses.replace(
                verdict,
                rewards={},
                result=None,
                status="error",
                error_category=exc.error_category,
                error=str(exc),
                duration_seconds=time.monotonic() - started,
            )
        return verdict
