"""The verifier: score the workspace the agent left behind with the task's test script.

Order: harden (`reroll.hardening`: kill the agent's processes, undo planted build config and
start-up hooks), delete any reward file the agent wrote, upload the verifier folder, run
``test.sh`` as a script inside it in a clean environment, then read
``<logs>/verifier/reward.txt`` (one float) or ``reward.json`` (an object of numbers), the wire
formats BenchFlow and Harbor use. What hardening did goes to ``verifier/hardening.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from reroll.errors import VerifierError
from reroll.hardening import Baseline, harden, verifier_env
from reroll.sandbox.base import Sandbox
from reroll.sandbox.files import upload_dir
from reroll.tasks import Task


@dataclass(frozen=True)
class Verdict:
    """What the verifier found."""

    rewards: dict[str, float]
    """``{"reward": 1.0}`` for reward.txt, the object itself for reward.json."""
    duration_seconds: float


async def verify(
    sandbox: Sandbox, task: Task, env: dict[str, str], output_dir: Path, baseline: Baseline | None
) -> Verdict:
    """Run the task's verifier in `sandbox` and parse its reward.

    Args:
        sandbox: the started sandbox, agent finished or stopped.
        task: the task whose ``test.sh`` scores the run.
        env: the base environment of sandbox processes.
        output_dir: host folder (the run folder's ``verifier/``) for the test output and reward file.
        baseline: what `take_baseline` recorded before the agent ran (None: nothing to undo).

    Raises:
        VerifierError: no reward file, or one that does not parse; the message carries the end
            of the test script's output.
    """
    started = time.monotonic()
    client = sandbox.client
    layout = sandbox.layout
    options = task.spec.verifier.hardening
    report = await harden(sandbox, options, baseline, env)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "hardening.json").write_text(json.dumps(dataclasses.asdict(report), indent=2))
    reward_dir = f"{layout.logs_dir}/verifier"
    await client.exec(
        ["rm", "-f", f"{reward_dir}/reward.txt", f"{reward_dir}/reward.json"], inherit_env=False
    )
    verifier_dir = layout.path(task.verifier_mount)
    await upload_dir(client, task.verifier_dir, verifier_dir)
    result = await client.exec(
        ["sh", "-c", "chmod +x test.sh && exec ./test.sh"],
        cwd=verifier_dir,
        env=verifier_env(sandbox, options, env, verifier_dir),
        inherit_env=False,
        timeout_seconds=task.spec.verifier.timeout_sec,
    )
    (output_dir / "test-stdout.txt").write_bytes(result.stdout)
    (output_dir / "test-stderr.txt").write_bytes(result.stderr)
    tail = result.output_text()[-1500:]
    if result.timed_out:
        raise VerifierError(f"verifier timed out after {task.spec.verifier.timeout_sec:.0f} s:\n{tail}")
    rewards = await _read_rewards(sandbox, reward_dir, output_dir, tail)
    return Verdict(rewards=rewards, duration_seconds=time.monotonic() - started)


async def _read_rewards(sandbox: Sandbox, reward_dir: str, output_dir: Path, tail: str) -> dict[str, float]:
    client = sandbox.client
    try:
        text = (await client.get_file(f"{reward_dir}/reward.txt")).decode("utf-8", errors="replace")
    except FileNotFoundError:
        pass
    else:
        (output_dir / "reward.txt").write_text(text)
        try:
            value = float(text.strip())
        except ValueError:
            raise VerifierError(f"reward.txt holds {text.strip()[:80]!r}, not a number") from None
        return {"reward": _finite(value, "reward.txt")}
    try:
        raw = (await client.get_file(f"{reward_dir}/reward.json")).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise VerifierError(
            f"the verifier wrote neither {reward_dir}/reward.txt nor reward.json; test output:\n{tail}"
        ) from None
    (output_dir / "reward.json").write_text(raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise VerifierError(f"reward.json is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
    ):
        raise VerifierError('reward.json must be an object of numbers, e.g. {"reward": 1.0}')
    return {key: _finite(float(value), "reward.json") for key, value in data.items()}


def _finite(value: float, source: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(f"{source} holds {value}, not a finite number")
    return value
