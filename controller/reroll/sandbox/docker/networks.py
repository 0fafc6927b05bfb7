"""The docker backend's networks: the shared ``full`` network and each rollout's own ``none`` one.

Under policy ``full`` every sandbox joins `FULL_NETWORK`; under ``none`` a rollout gets a bridge
of its own (`create_isolated_network`) whose only way out is the LLM proxy on its gateway, held
by the firewall (`reroll.sandbox.docker.firewall`).
"""

from __future__ import annotations

import contextlib
import secrets

import docker
import docker.errors
from docker.models.networks import Network
from reroll_contracts.errors import SandboxError

from reroll.cache import cache_lock
from reroll.host.owner import owner_label
from reroll.sandbox.allowlist import Resolved
from reroll.sandbox.docker import firewall
from reroll.sandbox.docker.engine import OWNER_LABEL, RUN_ID_LABEL
from reroll.sandbox.docker.images import MANAGED_LABEL

FULL_NETWORK = "reroll-full"
"""The bridge network every sandbox under network policy ``full`` joins (and `egress` lends)."""


ISOLATED_PREFIX = "reroll-none-"
"""A rollout's own network under policy ``none`` is ``reroll-none-<key>``, its bridge ``rr-<key>``."""


ICC_OPTION = "com.docker.network.bridge.enable_icc"
"""Bridge option: whether containers on the network reach each other (off for ``none``)."""


BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
"""Bridge option: the host's interface name of the bridge (the firewall's rules name it)."""


def _bridge_options(client: docker.DockerClient) -> dict[str, str]:
    """Options every reroll bridge gets: the engine's MTU (the default bridge's), which custom
    networks would not inherit."""
    bridge_options = client.networks.get("bridge").attrs.get("Options") or {}
    mtu_key = "com.docker.network.driver.mtu"
    return {mtu_key: bridge_options[mtu_key]} if mtu_key in bridge_options else {}


def ensure_full_network(client: docker.DockerClient) -> Network:
    """The shared network `FULL_NETWORK` (network policy ``full``), created when missing, with
    inter-container traffic off: its sandboxes reach the internet and the host's gateway, never
    each other (issue 32: a rollout's agent read a concurrent rollout's server at its address).

    Docker does not refuse a second network of the same name, so two rollouts that find it
    missing at once would each make one and every later lookup by name would fail as
    ambiguous: it is created under the host-wide lock ``<cache>/docker-network-full.lock``, and
    where duplicates exist already (left by an older reroll) the oldest with inter-container
    traffic off is kept and the others, when no container uses them, removed; one made by an
    older reroll with it on is replaced so (it goes once its last container has). Callers refer
    to it by its id.

    Raises:
        SandboxError: the network cannot be listed or created.
    """
    try:
        with cache_lock("docker-network-full"):
            found = client.networks.list(names=[FULL_NETWORK])
            exact = sorted(
                (n for n in found if n.name == FULL_NETWORK), key=lambda n: n.attrs.get("Created", "")
            )
            kept = next((n for n in exact if (n.attrs.get("Options") or {}).get(ICC_OPTION) == "false"), None)
            if kept is None:
                options = _bridge_options(client) | {ICC_OPTION: "false"}
                kept = client.networks.create(
                    FULL_NETWORK, driver="bridge", labels={MANAGED_LABEL: "1"}, options=options
                )
            for duplicate in exact:
                if duplicate.id != kept.id:
                    with contextlib.suppress(docker.errors.APIError):  # in use: left, harmless by id
                        duplicate.remove()
            return kept
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot create the docker network {FULL_NETWORK}: {exc}") from exc


def create_isolated_network(
    client: docker.DockerClient, run_id: str, *, services: bool = False, allowed: Resolved | None = None
) -> tuple[Network, str]:
    """A new network of one rollout under policy ``none`` (or with an allow-list in one of its
    phases), firewalled (`reroll.sandbox.docker.firewall`).

    Args:
        client: the engine.
        run_id: the rollout's id (the network's label).
        services: the rollout has image services: its containers reach each other on the network
            (inter-container traffic on, and the firewall lets it pass), nothing else changes.
        allowed: the first phase's allow-list (resolved): the network is routed (not internal)
            and its firewall lets through these addresses (`firewall.set_allowed` changes them).

    Returns:
        The network ``reroll-none-<key>`` (internal unless `allowed`, bridge ``rr-<key>``,
        labelled with `run_id`) and its key.

    Raises:
        SandboxError: the network or its firewall cannot be made (nothing is left behind); the
            engine's address pools are exhausted (the message says how to widen them).
    """
    key = secrets.token_hex(5)
    icc = "true" if services else "false"
    options = _bridge_options(client) | {ICC_OPTION: icc, BRIDGE_NAME_OPTION: f"rr-{key}"}
    try:
        network = client.networks.create(
            ISOLATED_PREFIX + key,
            driver="bridge",
            internal=allowed is None,
            labels={MANAGED_LABEL: "1", RUN_ID_LABEL: run_id, OWNER_LABEL: owner_label()},
            options=options,
        )
    except docker.errors.APIError as exc:
        hint = ""
        if "address pool" in str(exc):
            hint = (
                " (every rollout under network none has its own; widen default-address-pools in daemon.json)"
            )
        raise SandboxError(f"cannot create the docker network {ISOLATED_PREFIX + key}{hint}: {exc}") from exc
    try:
        firewall.install(key, f"rr-{key}", gateway(network), within=services, allowed=allowed)
        if allowed is not None:
            firewall.set_allowed(key, allowed)
    except BaseException:
        with contextlib.suppress(docker.errors.APIError):
            network.remove()
        raise
    return network, key


SERVICES_PREFIX = "reroll-services-"
"""Under policy ``full``, a rollout with image services gets a network of its own,
``reroll-services-<key>``, instead of the shared `FULL_NETWORK`: its services' names resolve to
its own sibling containers only, and no other rollout reaches them."""


def create_services_network(client: docker.DockerClient, run_id: str) -> Network:
    """A new bridge network (with the engine's outbound NAT) of one rollout under policy ``full``
    whose task has image services; `prune` removes it with its rollout.

    Raises:
        SandboxError: the network cannot be created.
    """
    name = SERVICES_PREFIX + secrets.token_hex(5)
    try:
        return client.networks.create(
            name,
            driver="bridge",
            labels={MANAGED_LABEL: "1", RUN_ID_LABEL: run_id, OWNER_LABEL: owner_label()},
            options=_bridge_options(client),
        )
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot create the docker network {name}: {exc}") from exc


def remove_isolated_network(network: Network) -> bool:
    """Remove a network of `create_isolated_network` and then its firewall table (in this order,
    so no packet of a sandbox passes unfiltered); either may be gone already.

    Returns:
        Whether it was removed; False when the engine refused (still in use), when the table is kept too.

    Raises:
        SandboxError: nft failed.
    """
    try:
        network.remove()
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError:
        return False
    firewall.remove(str(network.name).removeprefix(ISOLATED_PREFIX))
    return True


def gateway(network: Network) -> str:
    """The host's address on `network` (its bridge's gateway).

    Raises:
        SandboxError: the network has no IPv4 gateway.
    """
    network.reload()
    for config in network.attrs.get("IPAM", {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
    raise SandboxError(f"docker network {network.name} has no gateway address")
