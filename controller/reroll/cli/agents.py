"""``reroll agents``: the built-in agents."""

from __future__ import annotations

from reroll.cli.common import console


def agents() -> None:
    """List the built-in agents."""
    from reroll.agents import registry

    for spec in registry().values():
        console.print(f"[bold]{spec.name}[/bold]  ({spec.api_format})  {spec.description}")
