"""A warning about this machine said once per process: on stderr, where a user of the CLI sees it,
and to the log."""

from __future__ import annotations

import functools
import logging
import sys

logger = logging.getLogger("reroll")


@functools.cache
def warn_once(message: str) -> None:
    """Print `message` on stderr and log it as a warning, the first time only (per process)."""
    print(message, file=sys.stderr)
    logger.warning(message)
