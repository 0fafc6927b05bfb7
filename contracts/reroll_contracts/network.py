"""The network policy of a sandbox: one word, in a task's ``environment.network``, a job file,
``--network`` and a run's config.json; and the policy of each phase of a rollout
(`PhaseNetworks`), from a task's ``agent.network`` and ``verifier.network`` and their
``allowed_hosts`` (an allow-list: policy ``none`` plus the hosts listed, `AllowedHosts`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

NetworkPolicy = Literal["none", "full"]
"""A sandbox's egress: ``none`` (only the LLM proxy is reachable) or ``full``."""

AllowedHosts = tuple[str, ...]
"""A phase's allow-list under policy ``none`` (Harbor's and BenchFlow's ``allowed_hosts``, checked
by `reroll.tasks.allowlist.normalise`): hostnames, ``*.`` wildcards, IPv4/IPv6 addresses and CIDR
ranges, every port of each; empty: only the LLM proxy."""


EVERYWHERE: AllowedHosts = ("0.0.0.0/0", "::/0")
"""Every address, as an allow-list: the agent phase's under a deny list."""


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
    agent_allowed: AllowedHosts = ()
    """What the agent phase reaches beyond the LLM proxy under ``none`` (ignored under ``full``)."""
    verifier_allowed: AllowedHosts = ()
    """What the verify phase reaches under ``none`` (ignored under ``full``)."""
    agent_denied: AllowedHosts = ()
    """Hostnames the agent phase may not reach (BenchFlow's ``blocked_hosts`` under
    ``network_mode = "denylist"``), each with its subdomains: the phase then runs as ``none`` with
    `EVERYWHERE` allowed less these (their addresses, resolved on the host when it starts)."""
    agent_blocked_urls: tuple[str, ...] = ()
    """URL prefixes the agent phase may not reach (BenchFlow's ``blocked_urls``): the phase then
    runs as ``none`` with nothing allowed, its HTTP(S) through the controller's interceptor, which
    answers 403 under these and for `agent_denied` (`reroll.host.intercept.DenyList`)."""

    def allowed(self, phase: Literal["agent", "verifier"]) -> AllowedHosts | None:
        """`phase`'s allow-list: None under ``full`` (everything), else its hosts (empty: nothing
        but the LLM proxy)."""
        if phase == "agent":
            return None if self.agent == "full" else self.agent_allowed
        return None if self.verifier == "full" else self.verifier_allowed

    @property
    def filtered(self) -> bool:
        """A phase has an allow-list: the sandbox needs a network that routes out through a
        firewall (docker) or an allow-checking proxy (`local`)."""
        return bool(self.allowed("agent") or self.allowed("verifier"))

    @property
    def verifier_stricter(self) -> bool:
        """The verify reaches nothing outside the sandbox (``none``, no allow-list) while the agent
        could (``full`` or an allow-list): it gets a namespace with only loopback."""
        return self.allowed("verifier") == () and self.allowed("agent") != ()

    @property
    def verifier_looser(self) -> bool:
        """The verify may reach everything (``full``) and the agent could not (``none``, with or
        without an allow-list)."""
        return self.agent == "none" and self.verifier == "full"

    @property
    def verifier_listed(self) -> bool:
        """The verify has an allow-list other than the agent phase's: the sandbox's firewall or
        proxy switches to it for the verify."""
        verifier = self.allowed("verifier")
        return bool(verifier) and verifier != self.allowed("agent")
