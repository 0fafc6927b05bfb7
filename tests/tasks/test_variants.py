"""A loaded task as one run changes it (unit tests)."""

from __future__ import annotations

from pathlib import Path

from reroll.tasks.task import load_task
from reroll.tasks.variants import with_network
from reroll_contracts.network import PhaseNetworks

FIXTURE = Path(__file__).parents[1] / "fixtures" / "benchflow-phase-network"


def test_a_run_s_network_override_holds_for_every_phase() -> None:
    """``--network none`` leaves no phase the task's looser policy: the verifier's ``full`` goes too."""
    task = load_task(FIXTURE)
    assert task.spec.networks() == PhaseNetworks(agent="none", verifier="full")
    assert with_network(task, "none").spec.networks() == PhaseNetworks(agent="none", verifier="none")
    assert with_network(task, "full").spec.networks() == PhaseNetworks(agent="full", verifier="full")
    assert with_network(task, None) is task


def test_a_run_s_network_override_drops_every_allow_list() -> None:
    """``--network full`` over an allow-list is everything; ``--network none``, the LLM proxy only."""
    task = load_task(FIXTURE)
    spec = task.spec
    listed = spec.model_copy(
        update={
            "agent": spec.agent.model_copy(update={"allowed_hosts": ["pypi.org"]}),
            "environment": spec.environment.model_copy(
                update={"network": "none", "allowed_hosts": ["10.0.0.1"]}
            ),
        }
    )
    task = task.model_copy(update={"spec": listed})
    assert task.spec.networks() == PhaseNetworks(
        agent="none", verifier="full", agent_allowed=("pypi.org",), verifier_allowed=()
    )
    assert with_network(task, "none").spec.networks() == PhaseNetworks(agent="none", verifier="none")
    assert with_network(task, "full").spec.networks() == PhaseNetworks(agent="full", verifier="full")
