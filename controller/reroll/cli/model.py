"""``reroll model serve``: the bundled scripted model server."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer


def model_serve(
    script: Annotated[Path, typer.Option(help="The script file (YAML or JSON turns).")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
) -> None:
    """Serve the scripted model (OpenAI-compatible) until interrupted."""
    # The server belongs to the proxy's component: this process becomes it (exit 2: a bad script).
    os.execv(
        sys.executable,
        [
            sys.executable,
            "-m",
            "reroll_proxy.scripted",
            "--script",
            str(script),
            "--host",
            host,
            "--port",
            str(port),
        ],
    )
