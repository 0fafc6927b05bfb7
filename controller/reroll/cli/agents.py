"""``reroll agents``: the built-in agents."""

from __future__ import annotations

from reroll.agents import registry
from reroll.cli.common import console


def agents() -> None:
    """List the built-in agents."""
    for spec in registry().values():
        console.print(f"[bold]{spec.name}[/bold]  ({spec.api_format})  {spec.description}")
