"""Rich renderings of the reports of ``reroll replay`` and ``reroll branch`` (for the CLI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table

if TYPE_CHECKING:
    from reroll.rollout.commands.replay import FidelityReport
    from reroll.runfolder.summary import BranchSummary

_VERDICT_STYLE = {"match": "green", "diverged": "red", "missing": "yellow", "retried": "cyan"}


def fidelity_report(report: FidelityReport) -> RenderableType:
    """The per-step table of a fidelity check, then the workspace comparison and the verdict."""
    table = Table(title="replay fidelity, per step")
    table.add_column("step", justify="right")
    table.add_column("request")
    table.add_column("detail", overflow="fold")
    for step in report.steps:
        style = _VERDICT_STYLE[step.verdict]
        table.add_row(str(step.step), f"[{style}]{step.verdict}[/{style}]", step.detail)
    workspace = report.workspace
    if workspace is None:
        files = "[red]not compared[/red] (the rebuild left no workspace manifest)"
    elif workspace.equal:
        files = f"[green]equal[/green] ({workspace.files} files)"
    else:
        differences = [
            f"{label}: {', '.join(paths)}"
            for label, paths in (
                ("changed", workspace.changed),
                ("missing", workspace.missing),
                ("extra", workspace.extra),
            )
            if paths
        ]
        files = "[red]differs[/red] — " + "; ".join(differences)
    verdict = "[green]faithful[/green]" if report.faithful else "[red]not faithful[/red]"
    ending = "[green]same[/green]" if report.same_ending else "[red]differs[/red]"
    lines = [
        f"requests matched: {report.matched}/{len(report.steps)}",
        f"workspace: {files}",
        f"ending: {ending} (rebuild {report.status}, original {report.original_status})",
        f"rewards: original {report.original_rewards}, rebuilt {report.rebuilt_rewards}",
    ]
    if report.error:
        lines.append(f"rebuild error: {report.error}")
    lines += [f"rebuilt run folder: {report.rebuilt}", f"verdict: {verdict}"]
    return Group(table, *lines)


def branch_report(summary: BranchSummary) -> RenderableType:
    """A table of the branches (and how they reached their cut), one of the mean reward per model,
    and with several branch points one of the value per point (the value curve)."""
    via = f"via {summary.via}" + (f": {summary.note}" if summary.note else "")
    children = Table(title=f"branches from step {summary.cut_index} (--at {summary.at}, {via})")
    for column in ("branch", "model", "status", "reward"):
        children.add_column(column, justify="right" if column == "reward" else "left", overflow="fold")
    for child in summary.children:
        colour = {"ok": "green", "timeout": "yellow"}.get(child.status or "", "red")
        children.add_row(
            child.folder, child.model, f"[{colour}]{child.status}[/{colour}]", _number(child.reward)
        )
    models = Table(title="value estimate of the checkpoint: mean reward per model")
    for column in ("model", "branches", "scored", "mean reward"):
        models.add_column(column, justify="left" if column == "model" else "right", overflow="fold")
    for model in summary.models:
        models.add_row(model.model, str(model.branches), str(model.scored), _number(model.mean_reward))
    tables: list[RenderableType] = [children, models]
    if len(summary.points) > 1:
        points = Table(title="value per branch point: mean reward of its branches")
        for column in ("--at", "step", "given", "branches", "scored", "mean reward"):
            points.add_column(column, justify="right" if column in ("step", "mean reward") else "left")
        for point in summary.points:
            given = point.prompt if point.prompt is not None else point.answer
            points.add_row(
                point.at,
                str(point.cut_index),
                "" if given is None else repr(given),
                str(point.branches),
                str(point.scored),
                _number(point.mean_reward),
            )
        tables.append(points)
    return Group(*tables, f"parent folder: {summary.parent}")


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"
