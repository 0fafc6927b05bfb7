"""HTTP-level fault injection: the choice of a fault per request (pure: no I/O).

The plan file and the fault kinds are a contract with the controller and the user
(`reroll_contracts.faults`); `FaultSelector` picks the rule that fires at each step, and
`status_response` builds a ``status`` fault's answer. Steps are the proxy's step numbers (the
trajectory line index); every injected fault takes a step of its own when it answers in place
of the model.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from reroll_contracts.faults import FaultNote, FaultPlan, FaultRule, MalformedFault, ResetFault, StatusFault
from reroll_contracts.wire import WireFormat

MALFORMED_BODY = (
    b'{"id": "reroll-fault", "object": "chat.completion", "choices": [{"index": 0, "message": {"ro'
)
"""What a ``malformed`` fault sends: a JSON body cut short (not parseable)."""


IN_PLACE = (StatusFault, ResetFault, MalformedFault)
"""Faults answered in place of the model: the step consumes no recorded exchange and no live call."""


@dataclass
class FaultSelector:
    """Chooses the fault (if any) for each request, reproducibly.

    The probability draw of rule i at step s comes from ``Random(f"{seed}/{i}/{s}")``, so it does
    not depend on which other rules matched or on timing: the same plan, seed and steps give the
    same faults.

    Args:
        plan: the rules.
        seed: overrides ``plan.seed`` when given.
    """

    plan: FaultPlan
    seed: int | None = None
    injected: dict[str, int] = field(default_factory=dict)
    """Faults injected so far, by rule name."""

    def choose(self, step: int, path: str, last_message: str) -> FaultNote | None:
        """The fault to inject at `step`, or None; counts it against its rule's `times`.

        Args:
            step: the step the request gets (0-based).
            path: its URL path.
            last_message: the text of its last message (`last_message_text`).
        """
        seed = self.plan.seed if self.seed is None else self.seed
        for index, rule in enumerate(self.plan.rules):
            name = rule.name or f"rule-{index}"
            if rule.times is not None and self.injected.get(name, 0) >= rule.times:
                continue
            if not _selects(rule, step, path, last_message):
                continue
            if (
                rule.probability is not None
                and random.Random(f"{seed}/{index}/{step}").random() >= rule.probability
            ):
                continue
            self.injected[name] = self.injected.get(name, 0) + 1
            return FaultNote(rule=name, spec=rule.fault)
        return None


def _selects(rule: FaultRule, step: int, path: str, last_message: str) -> bool:
    return (
        (rule.steps is None or step in rule.steps)
        and (rule.from_step is None or step >= rule.from_step)
        and (rule.path is None or rule.path == path)
        and (rule.last_message_contains is None or rule.last_message_contains in last_message)
        and (rule.last_message_regex is None or re.search(rule.last_message_regex, last_message) is not None)
    )


def last_message_text(wire: WireFormat, body: dict[str, Any]) -> str:
    """Every string in the last message of request `body` (its text, tool results, tool call
    names and arguments; not block types), joined by newlines ("" if none)."""
    messages = wire.normalise(body)["messages"]
    return "\n".join(_strings(messages[-1]["content"])) if messages else ""


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() if key != "type" for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


_ANTHROPIC_KINDS = {429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
_OPENAI_KINDS = {429: "rate_limit_exceeded", 503: "service_unavailable", 529: "overloaded"}


def status_response(wire: WireFormat, fault: StatusFault) -> tuple[int, dict[str, str], bytes]:
    """The (status, headers, body) a ``status`` fault answers, the body in `wire`'s error shape."""
    anthropic = wire.name == "anthropic-messages"
    default = "invalid_request_error" if fault.status_code < 500 else "api_error"
    kind = (_ANTHROPIC_KINDS if anthropic else _OPENAI_KINDS).get(fault.status_code, default)
    message = f"reroll fault injection: HTTP {fault.status_code}"
    headers = {"content-type": "application/json"}
    if fault.retry_after_seconds is not None:
        headers["retry-after"] = f"{fault.retry_after_seconds:g}"
        headers["retry-after-ms"] = f"{fault.retry_after_seconds * 1000:g}"
    return fault.status_code, headers, wire.error_body(kind, message)
