"""The verify phase's network (`verify_network`): what the test script may reach, per the task's
per-phase policy (`reroll_contracts.network.PhaseNetworks`), given for the verify only."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from reroll_contracts.errors import SandboxError
from reroll_contracts.network import PhaseNetworks

from reroll.sandbox.base import Sandbox
from reroll.sandbox.seam import PhaseAllowList


@contextlib.asynccontextmanager
async def verify_network(sandbox: Sandbox, networks: PhaseNetworks) -> AsyncIterator[dict[str, str]]:
    """The verify phase's network, given only while inside: where the verifier's policy is looser
    than the agent's (agent ``none``, verifier ``full``), the sandbox's `Sandbox.egress` (docker:
    the container joins a network with internet access; `local`: an HTTP CONNECT proxy named by
    the proxy variables), entered after every process of the agent was ended (`verify` keeps none
    then); elsewhere nothing changes (a stricter verifier's own loopback-only namespace is the
    sidecar's, `VerifyScript.own_network`). Where the verifier has an allow-list of its own
    (`PhaseNetworks.verifier_listed`), or the sandbox enforces the agent's and the verifier is
    looser, the sandbox switches to the verifier's list (`PhaseAllowList.allow_only`; ``full``:
    everything) for the verify.

    Yields:
        Environment the test script needs to use that access (proxy variables, a CA bundle).

    Raises:
        SandboxError: the verifier has an allow-list and the sandbox cannot enforce one.
    """
    if networks.verifier_listed or (networks.verifier_looser and networks.filtered):
        if not isinstance(sandbox, PhaseAllowList):
            raise SandboxError(f"{sandbox.label}: cannot enforce the verifier's allowed_hosts")
        async with sandbox.allow_only(networks.allowed("verifier")) as env:
            yield env
        return
    if not networks.verifier_looser:
        yield {}
        return
    async with sandbox.egress() as env:
        yield env
