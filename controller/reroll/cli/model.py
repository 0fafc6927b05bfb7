"""``reroll model serve``: the bundled scripted model server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from reroll_contracts.errors import RerollError

from reroll.cli.common import refuse


def model_serve(
    script: Annotated[Path, typer.Option(help="The script file (YAML or JSON turns).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
) -> None:
    """Serve the scripted model (OpenAI-compatible) until interrupted."""
    from reroll.models.scripted import serve

    try:
        asyncio.run(serve(script, host=host, port=port))
    except KeyboardInterrupt:
        pass
    except RerollError as exc:
        refuse(exc)
