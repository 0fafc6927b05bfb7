"""Benchmark: ``reroll export`` of a 1,000-exchange run and of a 100-rollout job.

    .venv/bin/python scripts/bench/export.py [--exchanges 1000] [--rollouts 100]
        [--rollout-exchanges 20]

Writes synthetic run folders into a temporary folder (Chat Completions, every request holding
the whole conversation so far, one tool call and its result per exchange, as a tool-calling
agent sends them), then times, in this process, loading them (`reroll.runfolder.run.load_run_folder`:
reading and validating every JSONL line, the baseline) and exporting them to ATIF and to
verifiers records (`reroll.export.export_lines`, loading included). Prints seconds and the ratio
of each export to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from reroll.export import export_lines, sources
from reroll.runfolder.run import RunConfig, RunResult, write_json
from reroll_contracts.trajectory import Exchange

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def write_run(folder: Path, exchanges: int) -> int:
    """A run folder of `exchanges` exchanges; returns the trajectory's size in bytes."""
    (folder / "trajectory").mkdir(parents=True)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineer. " * 20},
        {"role": "user", "content": "Fix the failing test in this repository."},
    ]
    size = 0
    with open(folder / "trajectory" / "llm_trajectory.jsonl", "wb") as out:
        for step in range(exchanges):
            call = {
                "id": f"call_{step}",
                "type": "function",
                "function": {
                    "name": "bash",
                    "arguments": orjson.dumps({"command": f"ls -la dir{step}"}).decode(),
                },
            }
            answer = {"role": "assistant", "content": f"Looking at dir{step}.", "tool_calls": [call]}
            completion = {
                "id": f"c{step}",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": answer, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 100 * step, "completion_tokens": 20},
            }
            line = Exchange.model_validate(
                {
                    "request": {
                        "timestamp": "2026-01-01T00:00:00+00:00",
                        "path": "/v1/chat/completions",
                        "body": {"model": "m", "messages": messages, "tools": TOOLS},
                    },
                    "response": {
                        "timestamp": "2026-01-01T00:00:01+00:00",
                        "status_code": 200,
                        "body": completion,
                    },
                    "metadata": {"step": step, "api_format": "openai-chat", "model": "m"},
                }
            ).to_line()
            out.write(line)
            size += len(line)
            messages = [
                *messages,
                answer,
                {"role": "tool", "tool_call_id": call["id"], "content": f"total 0\nfile{step}.py\n" * 3},
            ]
    write_json(
        folder / "config.json", RunConfig(task_path="/tasks/fix", task_name="fix", agent="bench", model="m")
    )
    write_json(folder / "result.json", RunResult(status="ok", rewards={"reward": 1.0}))
    write_json(folder / "prompts.json", ["Fix the failing test in this repository."])
    return size


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def measure(label: str, path: Path) -> None:
    load = timed(lambda: [source.run for source in sources(path)])
    atif = timed(lambda: sum(len(piece) for piece in export_lines(path, "atif")))
    verifiers = timed(lambda: sum(len(piece) for piece in export_lines(path, "verifiers")))
    print(f"{label}: load {load:.2f} s (baseline)")
    print(f"  export atif      {atif:.2f} s  ({atif / load:.1f}x load)")
    print(f"  export verifiers {verifiers:.2f} s  ({verifiers / load:.1f}x load)")


def workloads(tmp: Path, description: str | None) -> list[tuple[str, Path]]:
    """Parse the workload flags and write the two workloads into `tmp`.

    Returns ``[(label, folder)]``: one run of ``--exchanges`` exchanges, then a job folder of
    ``--rollouts`` run folders of ``--rollout-exchanges`` exchanges each (shared by the view
    benchmark, so both measure the same folders).
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--exchanges", type=int, default=1000)
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--rollout-exchanges", type=int, default=20)
    args = parser.parse_args()
    run = tmp / "run"
    size = write_run(run, args.exchanges)
    job = tmp / "job"
    sizes = [write_run(job / f"fix__bench__m__r{k}", args.rollout_exchanges) for k in range(args.rollouts)]
    (job / "job.json").write_text("{}")
    return [
        (f"one run of {args.exchanges} exchanges ({size / 1e6:.0f} MB of JSONL)", run),
        (
            f"a job of {args.rollouts} rollouts x {args.rollout_exchanges} exchanges "
            f"({sum(sizes) / 1e6:.0f} MB)",
            job,
        ),
    ]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="reroll-bench-export-") as tmp:
        for label, folder in workloads(Path(tmp), __doc__):
            measure(label, folder)


if __name__ == "__main__":
    main()
