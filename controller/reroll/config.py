"""Host-side settings read from the environment, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """reroll's cache folder.

    ``$REROLL_CACHE_DIR``, else ``$XDG_CACHE_HOME/reroll``, else ``~/.cache/reroll``.

    Holds installed agents (``agents/``); safe to delete, it is rebuilt on demand.
    """
    if env := os.environ.get("REROLL_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reroll"
