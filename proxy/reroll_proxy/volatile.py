"""Volatile parts of a request, declared: what legitimately differs between a recording and its replay (pure).

Before the engine matches a request to a recorded thread or looks for a divergence
(`reroll_proxy.engine`, `reroll_proxy.divergence`), both the recorded and the live body go
through the same layers, so a difference in a volatile part is never a divergence and any
other difference still is:

1. per sandbox and per agent, the `VolatileRule` list of the proxy's config
   (`reroll_contracts.proxy.ProxyConfig.volatile`), applied to the raw JSON body by `Volatility`:
   the controller adds one ``value`` rule per path the sandbox knows (workspace, HOME, sandbox
   root, the recorded sandbox's too) and the agent's declared rules (``volatile:`` in an agent
   declaration, `reroll.agents.AgentSpec.volatile`) — e.g. a datetime in the system prompt,
   ``Chunk ID: …`` in a tool's output, ``client_metadata.session_id``;
2. per API format, the normal form (`reroll_contracts.wire.normal`): ids, timestamps,
   ``cache_control`` and signatures (``VOLATILE_KEYS``) at any depth, and the body fields that are
   not model parameters (``IGNORED_PARAMS``: ``model``, ``metadata``, ``user``...).

A rule is exactly one of:

- ``path``: a dotted path into the body; ``*`` stands for every key of an object or every
  element of a list, a number for one element: ``metadata.user_id``,
  ``messages.*.content.*.cache_control``, ``input.0.content``. The value there is dropped (a
  path that is absent is no error);
- ``pattern``: a regular expression (Python `re` syntax); every match inside any string of the
  body (keys excluded) is replaced by ``<label>``;
- ``value``: a literal string; every occurrence inside any string is replaced by ``<label>``
  (longer values first, so a workspace path inside the sandbox root is named as the workspace).

Paths are applied first, then values, then patterns, each in the order given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from reroll_contracts.proxy import VolatileRule


class Volatility:
    """Applies a list of `VolatileRule` to request bodies.

    Args:
        rules: the rules, in the order given (see the module docstring for the order of kinds).
    """

    def __init__(self, rules: Sequence[VolatileRule] = ()) -> None:
        self.rules = tuple(rules)
        self._paths = [rule.path.split(".") for rule in self.rules if rule.path is not None]
        values = sorted((r for r in self.rules if r.value is not None), key=lambda r: -len(r.value or ""))
        self._values = [(rule.value or "", f"<{rule.label}>") for rule in values]
        self._patterns = [
            (re.compile(rule.pattern), f"<{rule.label}>") for rule in self.rules if rule.pattern is not None
        ]

    @cached_property
    def empty(self) -> bool:
        """Whether there is no rule (`apply` returns its argument)."""
        return not self.rules

    def apply(self, body: Any) -> Any:
        """`body` with its volatile parts dropped or replaced; `body` itself is not changed.

        Args:
            body: a JSON value (a request body).

        Returns:
            A new value (or `body` itself when there is no rule).
        """
        if self.empty:
            return body
        for parts in self._paths:
            body = _drop(body, parts)
        return self._replace(body) if self._values or self._patterns else body

    def _replace(self, value: Any) -> Any:
        if isinstance(value, str):
            for literal, placeholder in self._values:
                value = value.replace(literal, placeholder)
            for pattern, placeholder in self._patterns:
                value = pattern.sub(placeholder, value)
            return value
        if isinstance(value, dict):
            return {key: self._replace(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._replace(item) for item in value]
        return value


def _drop(value: Any, parts: list[str]) -> Any:
    """`value` without what `parts` (a split dotted path) points at; copies only along the path."""
    head, rest = parts[0], parts[1:]
    if isinstance(value, dict):
        keys = list(value) if head == "*" else [head] if head in value else []
        if not keys:
            return value
        copy = dict(value)
        for key in keys:
            if rest:
                copy[key] = _drop(value[key], rest)
            else:
                del copy[key]
        return copy
    if isinstance(value, list):
        if head == "*":
            indexes = range(len(value))
        elif head.isdigit() and int(head) < len(value):
            indexes = range(int(head), int(head) + 1)
        else:
            return value
        if not rest:
            return [item for index, item in enumerate(value) if index not in indexes]
        return [_drop(item, rest) if index in indexes else item for index, item in enumerate(value)]
    return value
