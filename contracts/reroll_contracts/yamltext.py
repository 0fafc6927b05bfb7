"""Parsing YAML text safely and fast: PyYAML's safe loader in libyaml's C form where PyYAML was
built with it (its wheels are), else its pure Python form (the same documents, the same
`yaml.YAMLError` on a bad one).

The C form parses reroll's agent declarations and a 40-step model script in 3 to 4 ms where the
Python form takes 34 to 38 ms: both are read on a branch's way to its first child's first request
(the command's agent registry, the scripted model server's registration of each child).
"""

from __future__ import annotations

from typing import Any

import yaml

_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """The Python value of the YAML document `text` (plain types only, as `yaml.safe_load`).

    Raises:
        yaml.YAMLError: it is not valid YAML.
    """
    return yaml.load(text, Loader=_LOADER)  # a safe loader (C or Python): plain types only
