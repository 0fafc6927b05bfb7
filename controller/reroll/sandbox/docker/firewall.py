"""Host firewall of a rollout's own bridge network under network policy ``none`` (nftables).

Docker's internal network stops routing out, but not packets *to the host*: from the container,
every host address (the bridge's gateway, docker0, the host's own IPs) answered a listener bound
to it or to all addresses (issue 12, item 3). So each rollout under ``none`` gets a bridge of its
own (`reroll.sandbox.docker.backend`) and one nftables table of its own, keyed by the bridge interface::

    table inet reroll_<key> {
      set ports { type inet_service; }          # the LLM proxy's port, the interceptor's
      chain input   { hook input priority filter - 1;
                      iifname "rr-<key>" ip daddr <gateway> tcp dport @ports accept
                      iifname "rr-<key>" reject }  # any other host address, port, protocol
      chain forward { hook forward priority filter - 1;
                      [iifname "rr-<key>" oifname "rr-<key>" accept]   # its own services
                      iifname "rr-<key>" drop; oifname "rr-<key>" drop }  # other sandboxes
    }

The bracketed rule is there only for a rollout with image services (sibling containers on the
same bridge, `reroll.environment.services`); its network then has inter-container traffic on.

A rollout with an allow-list in one of its phases (`routed`: its bridge is not internal, Docker
routes and masquerades it out) gets two sets of addresses more, and its forward chain lets
through what they hold and the answers::

      set allow4 { type ipv4_addr; flags interval; }   # the phase's allow-list, resolved
      set allow6 { type ipv6_addr; flags interval; }
      chain forward { ...
                      iifname "rr-<key>" ip daddr @allow4 accept
                      iifname "rr-<key>" ip6 daddr @allow6 accept
                      oifname "rr-<key>" ct state established,related accept
                      iifname "rr-<key>" reject; oifname "rr-<key>" drop }

`set_allowed` swaps the sets' content in one transaction when a phase starts (policy ``full`` is
``0.0.0.0/0`` and ``::/0``, an empty list nothing). A deny list (the agent phase's
``blocked_hosts``: ``0.0.0.0/0`` and ``::/0`` allowed) fills two sets more, ``deny4`` and
``deny6``, whose addresses are rejected before the allow sets are looked at
(``iifname "rr-<key>" ip daddr @deny4 reject``); the phases without one empty
them. The host's own addresses stay behind the
input chain whatever the sets hold (an address of the host is delivered, not forwarded).

nftables, not iptables: Docker (20.10 here, through iptables' nf_tables backend) owns the
``ip filter`` and ``ip nat`` tables and rewrites its chains when networks come and go or the
daemon restarts; a table of our own is never touched by it, nor does it touch Docker's. A drop
in any base chain on a hook is final whatever another table accepts, so the rules hold next to
Docker's; the table is created and deleted in one transaction (``nft -f``), and the ``inet``
family covers IPv4 and IPv6 alike. What is refused is rejected (TCP reset, ICMP "administratively
prohibited") rather than dropped, so a try fails at once instead of hanging until its timeout.
The ``nft`` program (Debian's ``nftables``) is used rather than a Python binding: its rule
language is the stable interface (pyroute2's nftables module is incomplete). Changing the host's
firewall needs root (CAP_NET_ADMIN); without it network ``none`` refuses to start rather than
run unfiltered.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from reroll_contracts.errors import SandboxError

from reroll.sandbox.allowlist import Resolved

TABLE_PREFIX = "reroll_"
"""Every table reroll creates is ``inet reroll_<key>``; `tables` lists only those."""
_KEY = re.compile(r"[0-9a-f]{1,12}")
_TIMEOUT_SECONDS = 30.0


def table_name(key: str) -> str:
    """The table of the rollout network whose key (hex, at most 12 digits) is `key`."""
    if not _KEY.fullmatch(key):
        raise ValueError(f"not a firewall key: {key!r}")
    return TABLE_PREFIX + key


def _nft(args: list[str], script: str = "") -> str:
    """Run ``nft`` with `args` (and `script` on stdin); its stdout.

    Raises:
        SandboxError: nft is missing, failed (its message quoted, e.g. no permission) or hung.
    """
    program = shutil.which("nft", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if program is None:
        raise SandboxError("network none needs nftables' nft program (Debian: apt-get install nftables)")
    try:
        done = subprocess.run(
            [program, *args], input=script, capture_output=True, text=True, timeout=_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"nft {' '.join(args)} did not finish within {_TIMEOUT_SECONDS:.0f} s") from exc
    if done.returncode != 0:
        raise SandboxError(
            f"nft {' '.join(args)} failed (network none needs root to firewall its bridge): "
            f"{done.stderr.strip()}"
        )
    return done.stdout


def install(
    key: str, bridge: str, gateway: str, *, within: bool = False, allowed: Resolved | None = None
) -> None:
    """Create the table of `key`: the sandbox behind interface `bridge` reaches `gateway` (IPv4)
    on the ports `allow_port` adds, and nothing else of the host nor any other network; with
    `within`, the containers on `bridge` reach each other (the rollout's sandbox and its
    services' sibling containers: ``iifname "<bridge>" oifname "<bridge>" accept`` first); with
    `allowed` (a routed bridge), the addresses it holds too (`set_allowed` changes them).

    Raises:
        SandboxError: as `_nft`.
    """
    table = table_name(key)
    among = f'iifname "{bridge}" oifname "{bridge}" accept\n    ' if within else ""
    sets = ""
    if allowed is not None:
        among += (
            f'iifname "{bridge}" ip daddr @deny4 reject with icmpx admin-prohibited\n    '
            f'iifname "{bridge}" ip6 daddr @deny6 reject with icmpx admin-prohibited\n    '
            f'iifname "{bridge}" ip daddr @allow4 accept\n    '
            f'iifname "{bridge}" ip6 daddr @allow6 accept\n    '
            f'oifname "{bridge}" ct state established,related accept\n    '
            f'iifname "{bridge}" meta l4proto tcp reject with tcp reset\n    '
            f'iifname "{bridge}" reject with icmpx admin-prohibited\n    '
        )
        sets = "".join(
            f"\n  set {kind}{version} {{ type ipv{version}_addr; flags interval; }}"
            for kind in ("allow", "deny")
            for version in (4, 6)
        )
    _nft(
        ["-f", "-"],
        f"""table inet {table} {{
  set ports {{ type inet_service; }}{sets}
  chain input {{
    type filter hook input priority filter - 1; policy accept;
    iifname "{bridge}" ip daddr {gateway} tcp dport @ports accept
    iifname "{bridge}" meta l4proto tcp reject with tcp reset
    iifname "{bridge}" reject with icmpx admin-prohibited
  }}
  chain forward {{
    type filter hook forward priority filter - 1; policy accept;
    {among}iifname "{bridge}" drop
    oifname "{bridge}" drop
  }}
}}
""",
    )


def allow_port(key: str, port: int) -> None:
    """Let the sandbox of `key` reach TCP `port` on its gateway.

    Raises:
        ValueError: not a port number.
        SandboxError: as `_nft` (e.g. no such table).
    """
    if not 0 < port < 65536:
        raise ValueError(f"not a TCP port: {port}")
    _nft(["add", "element", "inet", table_name(key), "ports", f"{{ {port} }}"])


def set_allowed(key: str, allowed: Resolved) -> None:
    """Make `allowed` the only addresses the sandbox of `key` (installed with an allow-list) reaches
    beyond its gateway's ports, less its denied ones (`Resolved.denied`, rejected first), in one
    transaction: no moment holds both lists or none.

    Raises:
        SandboxError: as `_nft` (e.g. no such table, or one installed without an allow-list).
    """
    table = table_name(key)
    lines = []
    for kind in ("allow", "deny"):
        for version in (4, 6):
            lines.append(f"flush set inet {table} {kind}{version}")
            if networks := allowed.of_version(version, denied=kind == "deny"):
                lines.append(f"add element inet {table} {kind}{version} {{ {', '.join(networks)} }}")
    _nft(["-f", "-"], "\n".join(lines) + "\n")


def remove(key: str) -> None:
    """Delete the table of `key`; nothing happens when there is none.

    Raises:
        SandboxError: as `_nft`.
    """
    if key in tables():
        _nft(["delete", "table", "inet", table_name(key)])


def tables() -> list[str]:
    """The keys of reroll's tables on this host (``inet reroll_<key>``), no other table's.

    Raises:
        SandboxError: as `_nft`.
    """
    keys = []
    for line in _nft(["list", "tables", "inet"]).splitlines():
        name = line.removeprefix("table inet ").strip()
        if name.startswith(TABLE_PREFIX) and _KEY.fullmatch(key := name.removeprefix(TABLE_PREFIX)):
            keys.append(key)
    return keys
