"""The fault plan file and the fault notes of exchange lines: what the controller, the user and the
LLM proxy share about HTTP-level fault injection (pure models; `load_plan` reads a plan file).

A plan (YAML) lists rules; each request the proxy serves is matched against them in order and
the first rule that selects it injects its fault::

    seed: 7                       # for `probability` (the same plan + seed = the same faults)
    rules:
      - name: rate-limit-burst    # recorded in metadata.fault.rule [default: rule-INDEX]
        from_step: 2              # selection: steps (list), from_step, probability, path,
        times: 3                  #   last_message_contains, last_message_regex (all must hold)
        fault: {kind: status, status_code: 429, retry_after_seconds: 1}
      - probability: 0.1
        fault: {kind: cut, after_events: 3}

Fault kinds (`Fault`): ``status`` (an error answered in place of the model, body in the
request's API error shape), ``latency`` (wait, then serve), ``stall`` (pause after N events of a
stream, or half the body of a response that is not streamed, for S seconds or forever),
``cut`` (drop the connection at the same point),
``reset`` (close the connection with a TCP RST, no response), ``malformed`` (a 200 whose body
is JSON cut short). Steps are the proxy's step numbers (the trajectory line index); every
injected fault takes a step of its own when it answers in place of the model.

How the proxy chooses and injects them is `reroll_proxy.faults` and `reroll_proxy.inject`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reroll_contracts.errors import FaultPlanError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StatusFault(_Strict):
    """Answer an HTTP error in place of the model (the upstream is not called)."""

    kind: Literal["status"] = "status"
    status_code: int = Field(ge=400, le=599)
    """E.g. 429 (rate limit), 500, 503, 529 (Anthropic's overloaded)."""
    retry_after_seconds: float | None = Field(default=None, ge=0)
    """Sent as ``Retry-After`` (and ``retry-after-ms``) when set."""


class LatencyFault(_Strict):
    """Wait, then serve the step as usual."""

    kind: Literal["latency"] = "latency"
    seconds: float = Field(gt=0)
    """Added before the response starts."""


class StallFault(_Strict):
    """The response pauses after some events (a stream) or half its body (not streamed)."""

    kind: Literal["stall"] = "stall"
    after_events: int = Field(default=1, ge=0)
    """Events sent before the pause."""
    seconds: float | None = Field(default=None, gt=0)
    """Length of the pause, then the rest of the stream follows; None stalls until the client gives up."""


class CutFault(_Strict):
    """The connection is dropped (TCP RST) after some events (a stream) or half the body (not streamed)."""

    kind: Literal["cut"] = "cut"
    after_events: int = Field(default=1, ge=0)
    """Events sent before the connection is closed."""


class ResetFault(_Strict):
    """The connection is reset (TCP RST) without any response."""

    kind: Literal["reset"] = "reset"


class MalformedFault(_Strict):
    """A 200 whose body is not valid JSON (`MALFORMED_BODY`; one SSE event of it for a stream)."""

    kind: Literal["malformed"] = "malformed"


Fault = Annotated[
    StatusFault | LatencyFault | StallFault | CutFault | ResetFault | MalformedFault,
    Field(discriminator="kind"),
]


class FaultRule(_Strict):
    """When to inject one fault; every selection field given must hold."""

    name: str | None = None
    """Recorded as ``metadata.fault.rule`` [default: ``rule-INDEX``]."""
    steps: list[int] | None = None
    """Only these steps (0-based proxy step numbers)."""
    from_step: int | None = Field(default=None, ge=0)
    """Only this step and later ones."""
    probability: float | None = Field(default=None, ge=0, le=1)
    """Each candidate step is selected with this probability (drawn from the plan's seed)."""
    path: str | None = None
    """Only requests to this URL path, e.g. ``/v1/messages``."""
    last_message_contains: str | None = None
    """Only requests whose last message's text contains this."""
    last_message_regex: str | None = None
    """Only requests whose last message's text matches this (``re.search``)."""
    times: int | None = Field(default=None, ge=1)
    """Inject at most this many times, then the rule is spent [default: unlimited]."""
    fault: Fault

    @field_validator("last_message_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class FaultPlan(_Strict):
    """A fault plan file."""

    seed: int = 0
    """Seed of the `FaultRule.probability` draws (a run's seed overrides it)."""
    rules: list[FaultRule] = Field(default_factory=list)


class FaultNote(BaseModel):
    """``metadata.fault`` of an exchange line: the fault injected at that step."""

    model_config = ConfigDict(extra="allow")
    rule: str
    """The rule's name."""
    spec: Fault
    """The fault, as planned."""
    replayed: bool = False
    """True when reproduced from a recorded fault line (replay), not chosen by a plan."""


def load_plan(path: Path) -> FaultPlan:
    """Read a YAML fault plan.

    Raises:
        FaultPlanError: the file is missing, not YAML, or not a valid plan (the message names it).
    """
    try:
        raw: Any = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise FaultPlanError(f"{path}: cannot read the fault plan ({exc.strerror or exc})") from exc
    except yaml.YAMLError as exc:
        raise FaultPlanError(f"{path}: not YAML ({exc})") from exc
    try:
        return FaultPlan.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise FaultPlanError(f"{path}: invalid fault plan:\n{exc}") from exc


class FaultsUsed(BaseModel):
    """The fault plan a rollout runs under (``reroll run --faults``): config.json's ``faults`` and
    the LLM proxy's `reroll_contracts.proxy.ProxyConfig.faults`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    plan_path: Path
    """The YAML plan (absolute in config.json)."""
    seed: int | None = None
    """The seed of its probability draws [default: the plan's ``seed``; config.json always
    records the one used]."""
