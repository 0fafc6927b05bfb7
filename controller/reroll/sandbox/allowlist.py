"""A phase's allow-list as addresses: hostnames are resolved on the host when the phase starts
(`resolve`), so the sandbox's firewall compares addresses, never names.

What a name resolves to later (a CDN's rotation, a short TTL) is not followed: the phase reaches
the addresses the host got when it started. A wildcard (``*.example.com``) names no address and
is unreachable (`Resolved.unresolved` says so), as is a name the host cannot resolve.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
from dataclasses import dataclass, field

from reroll.host.notices import warn_once
from reroll.sandbox.base import Sandbox

HOSTS_FILE = "/etc/hosts"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

EVERYWHERE: tuple[IPNetwork, ...] = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
"""Policy ``full`` as an allow-list."""


@dataclass(frozen=True)
class Resolved:
    """An allow-list's addresses."""

    networks: tuple[IPNetwork, ...] = ()
    """Every address or range reachable (IPv4 and IPv6)."""
    unresolved: tuple[str, ...] = field(default=())
    """Entries that gave no address (wildcards, unknown names): unreachable."""
    names: tuple[tuple[str, str], ...] = ()
    """(hostname, address) of every name resolved: the sandbox's ``/etc/hosts`` gets them, so a
    phase finds its hosts without a DNS server it may not reach."""
    denied: tuple[IPNetwork, ...] = ()
    """Addresses refused even where `networks` holds them: a deny list's names, resolved."""
    denied_names: tuple[str, ...] = ()
    """The deny list's hostnames: a proxy refuses each, and its subdomains, by name (`denies`)."""

    def denies(self, host: str) -> bool:
        """Whether `host` (a name or an address, as a client names it) is denied: one of
        `denied_names` or a subdomain of one, or an address `denied` holds."""
        host = host.lower().rstrip(".")
        if any(host == name or host.endswith("." + name) for name in self.denied_names):
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.denied)

    def hosts_file_lines(self) -> str:
        """``/etc/hosts`` lines naming each resolved address (``ADDRESS NAME``), one a line."""
        return "".join(f"{address} {name}\n" for name, address in self.names)

    def of_version(self, version: int, *, denied: bool = False) -> list[str]:
        """The networks (or, `denied`, the denied addresses) of IP `version` (4 or 6), as text
        (``10.0.0.5/32``)."""
        held = self.denied if denied else self.networks
        return [str(network) for network in held if network.version == version]


def resolve(hosts: tuple[str, ...] | None, denied: tuple[str, ...] = ()) -> Resolved:
    """The addresses of `hosts` (entries as `reroll.tasks.allowlist.normalise` spells them), looked
    up on the host now, less those of `denied` (hostnames, `reroll.tasks.allowlist.normalise_denied`,
    looked up too); None (policy ``full``) is `EVERYWHERE`.

    Returns:
        The addresses and CIDR ranges, duplicates dropped, and the entries that gave none; the
        denied names and their addresses (a name that gives none is still refused by name).
    """
    refused = tuple(dict.fromkeys(ipaddress.ip_network(a) for name in denied for a in _lookup(name)))
    if hosts is None:
        return Resolved(EVERYWHERE, denied=refused, denied_names=denied)
    networks: dict[IPNetwork, None] = {}
    unresolved, names = [], []
    for entry in hosts:
        try:
            networks.setdefault(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        addresses = _lookup(entry) if not entry.startswith("*.") else []
        if not addresses:
            unresolved.append(entry)
        for address in dict.fromkeys(addresses):
            networks.setdefault(ipaddress.ip_network(address))
            names.append((entry, address))
    return Resolved(tuple(networks), tuple(unresolved), tuple(names), refused, denied)


def _lookup(name: str) -> list[str]:
    """The IPv4 and IPv6 addresses the host's resolver gives for `name`; empty when none."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return []
    return [str(info[4][0]).partition("%")[0] for info in infos]


async def name_hosts(sandbox: Sandbox, resolved: Resolved | None) -> None:
    """Add `resolved`'s names to the sandbox's ``/etc/hosts`` (as root; a line already there is
    not repeated): a phase under an allow-list may reach no DNS server. None (``full``): nothing.
    Entries that gave no address are said once on stderr (they are unreachable).

    Raises:
        SandboxError: the sandbox failed the write (an image without ``sh`` is left as it is).
    """
    if resolved is not None and resolved.unresolved:
        warn_once(
            f"allowed_hosts: {', '.join(resolved.unresolved)} gave no address on this host: unreachable "
            "(a wildcard names none; list the hostnames it should cover)"
        )
    lines = resolved.hosts_file_lines() if resolved is not None else ""
    if not lines:
        return
    script = f"for line in {' '.join(shlex.quote(line) for line in lines.splitlines())}; do "
    script += f'grep -qxF "$line" {HOSTS_FILE} || printf "%s\\n" "$line" >> {HOSTS_FILE}; done'
    await sandbox.exec(["sh", "-c", script], timeout_seconds=30.0)
