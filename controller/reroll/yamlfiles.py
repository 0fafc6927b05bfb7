"""Reading the YAML files users write (job files, trial files): one mapping each, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from reroll_contracts.errors import ConfigError


def read_mapping(path: Path, error: type[ConfigError], what: str, keys: str) -> dict[str, Any]:
    """The YAML mapping in `path`.

    Args:
        path: the file.
        error: the error class raised (e.g. `reroll_contracts.errors.JobError`).
        what: what the file is, for the messages (``job file``).
        keys: the keys it should have, for the message of a file that is no mapping (``scenes:``).

    Raises:
        `error`: the file cannot be read, is not YAML, or holds no mapping; the message names it.
    """
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read the {what} ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise error(f"{path}: a {what} is a mapping ({keys}), got {type(raw).__name__}")
    return raw
