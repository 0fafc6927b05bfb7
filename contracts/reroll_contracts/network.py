"""The network policy of a sandbox: one word, in a task's ``environment.network``, a job file,
``--network`` and a run's config.json."""

from __future__ import annotations

from typing import Literal

NetworkPolicy = Literal["none", "full"]
"""A sandbox's egress: ``none`` (only the LLM proxy is reachable) or ``full``."""
