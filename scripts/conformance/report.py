"""The conformance table: printed to the terminal and written as a Markdown docs page."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from classify import VERDICTS, Classified


def totals(results: Sequence[Classified]) -> Counter[str]:
    """How many results fall in each class (every class present, zero or not)."""
    counts: Counter[str] = Counter(dict.fromkeys(VERDICTS, 0))
    counts.update(result.verdict for result in results)
    return counts


def headline(results: Sequence[Classified]) -> str:
    """``oracle pass: P of N (offline-capable)``: N counts the tasks that need no host out of reach
    and whose files are whole (passes and reroll defects)."""
    counts = totals(results)
    capable = counts["pass"] + counts["reroll-defect"]
    return f"oracle pass: {counts['pass']} of {capable} (offline-capable)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or "-"


def markdown(
    results: Sequence[Classified], *, commit: str, sandbox: str, command: str, about: str = ""
) -> str:
    """The docs page (``docs/conformance.md``): the totals per class, the headline and one row per
    task with its class and evidence, stamped with the commit and the command that measured it;
    `about` (Markdown: which sample, which runs) follows the header."""
    counts = totals(results)
    lines = [
        "# Conformance: the oracle over public tasks",
        "",
        f"Measured on commit `{commit}`, sandbox `{sandbox}`, with:",
        "",
        f"    {command}",
        "",
        *([about.strip(), ""] if about.strip() else []),
        "Each task's reference solution runs as its agent (`--agent oracle`); a task passes when its",
        "verifier gives the oracle's reward (1.0). Failures are classified from their logs",
        "(`scripts/conformance/classify.py`): a host out of reach (DNS, a package index, a registry)",
        "is `needs-internet` (so is a FROM image of another registry or namespace that is not local;",
        "a Docker Hub official one, such as `python:3.12`, is a `reroll-defect`: reroll's catalogue",
        "could stand in for it); a Dockerfile COPY of a file the task folder lacks is `task-broken`;",
        "anything else is a `reroll-defect` until shown otherwise.",
        "",
        f"**{headline(results)}**",
        "",
        "| class | tasks |",
        "|---|---|",
        *(f"| {verdict} | {counts[verdict]} |" for verdict in VERDICTS),
        "",
        "| task | class | status | reward | evidence | verifier's last lines |",
        "|---|---|---|---|---|---|",
    ]
    for result in sorted(results, key=lambda r: (VERDICTS.index(r.verdict), r.task)):
        reward = "-" if result.reward is None else f"{result.reward:g}"
        lines.append(
            f"| {result.task} | {result.verdict} | {result.status} | {reward} | "
            f"{_cell(result.evidence)} | {_cell(result.verifier_tail)} |"
        )
    return "\n".join(lines) + "\n"


def plain_table(results: Sequence[Classified]) -> str:
    """The terminal table: one line per task (class, status, reward, evidence) and the totals."""
    width = max((len(result.task) for result in results), default=4)
    rows = [f"{'task':<{width}}  {'class':<14}  {'status':<7}  reward  evidence"]
    for result in sorted(results, key=lambda r: (VERDICTS.index(r.verdict), r.task)):
        reward = "-" if result.reward is None else f"{result.reward:g}"
        rows.append(
            f"{result.task:<{width}}  {result.verdict:<14}  {result.status:<7}  {reward:<6}  "
            f"{result.evidence[:160]}"
        )
    counts = totals(results)
    rows.append("totals: " + ", ".join(f"{verdict} {counts[verdict]}" for verdict in VERDICTS))
    rows.append(headline(results))
    return "\n".join(rows)
