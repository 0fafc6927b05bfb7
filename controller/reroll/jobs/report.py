"""The job summary table ``reroll job`` and ``reroll continue-job`` print (from a `JobSummary`), and
the learner store's generations (``reroll store log``, a ``sequential-shared`` job's summary)."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from reroll.runfolder.summary import GenerationSummary, JobSummary, JobTotals, RolloutSummary, totals


def print_summary(summary: JobSummary, console: Console) -> None:
    """Print one table row per (task, agent, model) and a total row (reward: the mean of ``reward``)."""
    table = Table(title=f"job {summary.job} ({summary.wall_seconds:.1f} s)")
    for column in (
        "task",
        "agent",
        "model",
        "runs",
        "ok",
        "timeout",
        "error",
        "mean reward",
        "exchanges",
        "tokens",
    ):
        table.add_column(column, justify="right" if column not in ("task", "agent", "model") else "left")
    groups: dict[tuple[str, str, str], list[RolloutSummary]] = defaultdict(list)
    for rollout in summary.rollouts:
        groups[(rollout.task, rollout.agent, rollout.model or "-")].append(rollout)
    for (task, agent, model), rollouts in sorted(groups.items()):
        table.add_row(task, agent, model, *_cells(totals(rollouts)))
    table.add_section()
    table.add_row("all", "", "", *_cells(summary.totals), style="bold")
    console.print(table)
    if summary.store is not None:
        print_generations(summary.store, console)
    for rollout in summary.rollouts:
        if rollout.status == "error":
            console.print(f"[red]error[/red] {rollout.name}: {rollout.error_category}: {rollout.error}")


def _cells(group: JobTotals) -> list[str]:
    counts = group.status_counts
    mean = group.reward_means.get("reward")
    return [
        str(group.rollouts),
        str(counts.get("ok", 0)),
        str(counts.get("timeout", 0)),
        str(counts.get("error", 0) + counts.get("unknown", 0)),
        "-" if mean is None else f"{mean:.3f}",
        str(group.exchanges),
        str(group.tokens),
    ]


def print_generations(generations: list[GenerationSummary], console: Console) -> None:
    """One row per generation of a learner store: parent, rollout, status, reward, files, and what
    changed from its parent (``+added ~modified -removed``); ``*`` marks the head."""
    table = Table(title="learner store")
    for column in ("gen", "parent", "rollout", "status", "reward", "files", "changes"):
        numeric = column in ("gen", "parent", "reward", "files")
        table.add_column(column, justify="right" if numeric else "left")
    for generation in generations:
        table.add_row(
            f"{generation.generation}{'*' if generation.head else ''}",
            "-" if generation.parent is None else str(generation.parent),
            generation.rollout or "(initial)",
            generation.status or "-",
            "-" if generation.reward is None else f"{generation.reward:.3f}",
            str(generation.files),
            generation.changes.describe(),
        )
    console.print(table)
