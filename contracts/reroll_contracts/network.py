"""The network policy of a sandbox: one word, in a task's ``environment.network``, a job file,
``--network`` and a run's config.json; and the policy of each phase of a rollout
(`PhaseNetworks`), from a task's ``agent.network`` and ``verifier.network``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

NetworkPolicy = Literal["none", "full"]
"""A sandbox's egress: ``none`` (only the LLM proxy is reachable) or ``full``."""


class PhaseNetworks(BaseModel):
    """The network policy of each phase of a rollout: the agent's (the oracle's too: it is the
    agent phase) and the verifier's. The sandbox runs with `agent`; the verify gets `verifier`
    for its duration (`verifier_stricter`: a network namespace of its own with only loopback;
    `verifier_looser`: the sandbox's egress while it runs, the agent's processes ended first)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    agent: NetworkPolicy = "full"
    """The agent phase's egress (the oracle's too)."""
    verifier: NetworkPolicy = "full"
    """The verify phase's egress (the task's test script)."""

    @property
    def verifier_stricter(self) -> bool:
        """The verify may reach less than the agent could (agent ``full``, verifier ``none``)."""
        return self.agent == "full" and self.verifier == "none"

    @property
    def verifier_looser(self) -> bool:
        """The verify may reach more than the agent could (agent ``none``, verifier ``full``)."""
        return self.agent == "none" and self.verifier == "full"
