"""How the proxy tells whose a request is: the tokens it presents, and the site it arrived at.

A token is looked up by its SHA-256 digest (`digest`), so the time a lookup takes tells nothing of
its characters; a token compared with one expected value is compared in constant time
(`matches`). A rollout's token opens its own site only (`arrived_at`).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import secrets

from reroll_proxy.messages import Request


def arrived_at(request: Request, address: tuple[str, int]) -> bool:
    """Whether `request` came in on the site at `address`: a rollout's token opens its own site
    only (its port; and its address, unless it listens on every interface)."""
    sockname = request.sockname
    if sockname is None:
        return False
    host, port = address
    if int(sockname[1]) != port:
        return False
    listened = _ip_address(host)
    if listened is None:  # a host name: its port decides
        return True
    return listened.is_unspecified or _ip_address(sockname[0]) == listened


@functools.lru_cache(maxsize=1024)
def _ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address (parsed once per host: it is asked on every request), None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def credentials(request: Request) -> list[bytes]:
    """The tokens `request` presents: ``Authorization: Bearer``, ``x-api-key``, ``api-key``."""
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    presented = [credential.strip()] if scheme.lower() == "bearer" else []
    presented += [request.headers.get(name, "") for name in ("x-api-key", "api-key")]
    return [value.encode() for value in presented if value]


def matches(presented: list[bytes], expected: str) -> bool:
    """Whether one of the `presented` tokens is `expected` (each compared in constant time)."""
    wanted = expected.encode()
    return any([secrets.compare_digest(value, wanted) for value in presented])
