"""Each phase's network policy (`reroll_contracts.network.PhaseNetworks`): which verify gets its own
loopback, which gets egress, which switches to its own allow-list."""

from __future__ import annotations

import pytest
from reroll_contracts.network import PhaseNetworks


@pytest.mark.parametrize(
    ("networks", "stricter", "looser", "listed"),
    [
        (PhaseNetworks(agent="full", verifier="none"), True, False, False),
        (PhaseNetworks(agent="none", verifier="full"), False, True, False),
        (PhaseNetworks(agent="none", verifier="none"), False, False, False),
        (PhaseNetworks(agent="none", verifier="none", agent_allowed=("a.org",)), True, False, False),
        (PhaseNetworks(agent="none", verifier="none", verifier_allowed=("a.org",)), False, False, True),
        (PhaseNetworks(agent="full", verifier="none", verifier_allowed=("a.org",)), False, False, True),
        (PhaseNetworks(agent="none", verifier="full", agent_allowed=("a.org",)), False, True, False),
        (  # the same list in both phases: nothing to switch
            PhaseNetworks(
                agent="none", verifier="none", agent_allowed=("a.org",), verifier_allowed=("a.org",)
            ),
            False,
            False,
            False,
        ),
    ],
)
def test_what_the_verify_changes(networks: PhaseNetworks, stricter: bool, looser: bool, listed: bool) -> None:
    assert (networks.verifier_stricter, networks.verifier_looser, networks.verifier_listed) == (
        stricter,
        looser,
        listed,
    )


def test_a_list_under_full_is_no_list() -> None:
    networks = PhaseNetworks(agent="full", verifier="full", agent_allowed=("a.org",))
    assert networks.allowed("agent") is None
    assert not networks.filtered
