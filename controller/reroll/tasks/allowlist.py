"""A phase's allow-list as a task writes it (Harbor's and BenchFlow's ``allowed_hosts`` with
``network_mode = "allowlist"``): `normalise` checks and spells the entries as Harbor 0.26 does.

Forms (Harbor's ``_validate_allowed_host_names``; BenchFlow 0.7.11 takes the hostname form only,
an IPv4 address passing as one): a hostname (``pypi.org``), a leading wildcard (``*.pypi.org``),
an IPv4 or IPv6 address, an IPv4 or IPv6 CIDR range (``10.0.0.0/8``, host bits clear). Neither
has ports, URLs or paths: an entry allows every port of its addresses ("network policies apply to
whole hosts", Harbor's ``inference_endpoint_host``). Entries are lower-cased, a trailing dot and
spaces dropped, IPv6 compressed.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from typing import Annotated

from pydantic import BeforeValidator

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def normalise(hosts: object) -> object:
    """`hosts` (a list) checked and spelt one way (see the module docstring); None is an empty
    list, anything else is left to pydantic's type check.

    Raises:
        ValueError: an entry is empty, a URL, carries a port or path, a wildcard not of the form
            ``*.NAME``, a wildcard over an address, or a CIDR range with host bits set (pydantic
            names the field; the message, the entry).
    """
    if hosts is None:
        return []
    return [_entry(raw) for raw in hosts] if isinstance(hosts, list) else hosts


AllowedHostsField = Annotated[list[str], BeforeValidator(normalise)]
"""A section's ``allowed_hosts``: checked and spelt by `normalise`."""


def _entry(raw: object) -> str:
    host = str(raw).strip().lower().rstrip(".")
    wrong = f"{raw!r} is not a hostname, *.hostname, IP address or CIDR range (no URLs, ports or paths)"
    if not host:
        raise ValueError("allowed_hosts entries must be non-empty")
    if "/" in host or ":" in host:
        try:
            network = ipaddress.ip_network(host, strict=True) if "/" in host else ipaddress.ip_address(host)
        except ValueError as exc:
            raise ValueError(wrong) from exc
        if "/" not in host and network.version != 6:
            raise ValueError(wrong)
        return network.compressed
    name = host.removeprefix("*.")
    if "*" in name:
        raise ValueError(f"{raw!r}: a wildcard must be a leading '*.'")
    if name != host and is_address(name):
        raise ValueError(f"{raw!r}: a wildcard must cover hostnames, not an address")
    if not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(wrong)
    return host


def is_address(entry: str) -> bool:
    """Whether `entry` (normalised) is an IP address or CIDR range rather than a name."""
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def normalise_denied(hosts: object) -> object:
    """BenchFlow's ``blocked_hosts`` (`reroll_contracts.network.PhaseNetworks.agent_denied`)
    checked and spelt: hostnames only (each also denies its subdomains), lower-cased, a trailing
    dot dropped; None is an empty list.

    Raises:
        ValueError: an entry is empty, a wildcard, an IP address, a URL, or carries a port or path
            (BenchFlow 0.7.11's ``_validate_blocked_hosts`` refuses the same).
    """
    if not isinstance(hosts, list):
        return [] if hosts is None else hosts
    spelt = [_entry(raw) for raw in hosts]
    for raw, host in zip(hosts, spelt, strict=True):
        if host.startswith("*.") or is_address(host):
            raise ValueError(f"{raw!r}: blocked_hosts entries are hostnames (each denies its subdomains)")
    return spelt


DeniedHostsField = Annotated[list[str], BeforeValidator(normalise_denied)]
"""An environment's ``blocked_hosts``: checked and spelt by `normalise_denied`."""


def normalise_blocked_urls(urls: object) -> object:
    """BenchFlow's ``blocked_urls`` (`reroll_contracts.network.PhaseNetworks.agent_blocked_urls`)
    checked and spelt as BenchFlow 0.7.11's ``_validate_blocked_urls`` does: ``https://`` added
    where no scheme is written, the host lower-cased without its trailing dot, the query, the
    fragment and a trailing slash of the path dropped (``Docs.Example.com/API/`` →
    ``https://docs.example.com/API``), duplicates dropped; None is an empty list.

    Raises:
        ValueError: an entry is empty, of a scheme other than http and https, carries userinfo or
            a port, or names an IP address or no valid hostname.
    """
    if not isinstance(urls, list):
        return [] if urls is None else urls
    spelt: dict[str, None] = {}
    for raw in urls:
        url = str(raw).strip()
        if not url:
            raise ValueError("blocked_urls entries must be non-empty URLs")
        parts = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{raw!r}: blocked_urls entries use the http or https scheme")
        if "@" in parts.netloc or ":" in parts.netloc:
            raise ValueError(f"{raw!r}: blocked_urls entries carry no userinfo and no port")
        host = parts.netloc.lower().rstrip(".")
        if not host or is_address(host) or not all(_LABEL.fullmatch(label) for label in host.split(".")):
            raise ValueError(f"{raw!r}: a blocked_urls entry names a hostname, not an address")
        spelt.setdefault(f"{parts.scheme}://{host}{parts.path.rstrip('/')}")
    return list(spelt)


BlockedUrlsField = Annotated[list[str], BeforeValidator(normalise_blocked_urls)]
"""An environment's ``blocked_urls``: checked and spelt by `normalise_blocked_urls`."""
