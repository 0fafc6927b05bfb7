"""A task's deny list as the interceptor checks it: BenchFlow's ``blocked_hosts`` (a host and its
subdomains) and ``blocked_urls`` (URL prefixes), with BenchFlow 0.7.11's matching semantics.

- A host is compared in its `host_key` form: lower case, no trailing dot, a leading ``www.``
  dropped (``https://www.example.com/a`` is under ``example.com/a``).
- A path is compared in its `path_key` form: query and fragment dropped, percent-escapes decoded
  (up to three rounds: ``%252e`` is ``.``), ``\\`` read as ``/``, ``;parameters`` of a segment
  dropped, empty and ``.`` segments dropped, ``..`` resolved, lower case.
- A URL is under an entry when its host key equals the entry's and its path key starts with the
  entry's (the entry's trailing slash dropped: ``/docs`` covers ``/docs/a`` and ``/docs2``, as
  BenchFlow's string prefix does). Scheme and port are ignored: an entry blocks ``http`` and
  ``https`` on every port.

Pure standard library, no I/O: the addon (`addon.py`, mitmproxy's interpreter) and reroll's own
tests import it. The addresses of the listed hosts are looked up by the addon.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass

DECODE_ROUNDS = 3
"""How many times a path is percent-decoded before it is compared (BenchFlow's count)."""


def host_key(host: str) -> str:
    """`host` as compared with a URL entry's: lower case, no trailing dot, no leading ``www.``."""
    host = host.strip().rstrip(".").lower()
    return host.removeprefix("www.")


def path_key(path: str) -> str:
    """`path` as compared with a URL entry's (see the module docstring): ``"/A/./b/../%43"`` →
    ``"/a/c"``; a trailing slash is kept (``"/a/"``), the root is ``"/"``."""
    path = path.split("?", 1)[0].split("#", 1)[0]
    for _ in range(DECODE_ROUNDS):
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    path = path.replace("\\", "/")
    kept: list[str] = []
    for segment in (part.split(";", 1)[0] for part in path.split("/")):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    key = "/" + "/".join(kept)
    if key != "/" and path.endswith(("/", "/.", "/..")):
        key += "/"
    return key.lower()


@dataclass(frozen=True)
class UrlEntry:
    """One ``blocked_urls`` entry (`url_entry` reads one): the host key and the path prefix it blocks."""

    host: str
    path: str

    def covers(self, host: str, path: str) -> bool:
        """Whether the URL of `host` (as the client named it) and `path` is under this entry."""
        return host_key(host) == self.host and path_key(path).startswith(self.path)


def url_entry(url: str) -> UrlEntry:
    """The entry of ``blocked_urls`` text `url` (``https://example.com/docs``; no scheme: ``https``).

    Raises:
        ValueError: the entry names no host.
    """
    parts = urllib.parse.urlsplit(url if "://" in url else f"https://{url}")
    if not parts.hostname:
        raise ValueError(f"blocked_urls entry names no host: {url!r}")
    return UrlEntry(host_key(parts.hostname), path_key(parts.path).rstrip("/") or "/")


@dataclass(frozen=True)
class UrlDenylist:
    """A task's deny list: hostnames (each with its subdomains) and URL prefixes."""

    hosts: tuple[str, ...] = ()
    urls: tuple[UrlEntry, ...] = ()

    @classmethod
    def parse(cls, hosts: list[str], urls: list[str]) -> UrlDenylist:
        """The deny list of ``blocked_hosts`` `hosts` and ``blocked_urls`` `urls` (as the task spells them).

        Raises:
            ValueError: a URL entry names no host.
        """
        names = tuple(dict.fromkeys(h.strip().rstrip(".").lower() for h in hosts if h.strip()))
        return cls(names, tuple(dict.fromkeys(url_entry(url) for url in urls)))

    def host_rule(self, host: str) -> str | None:
        """The ``blocked_hosts`` entry that denies `host` (it or a parent domain), else None."""
        name = host.strip().rstrip(".").lower()
        return next((h for h in self.hosts if name == h or name.endswith("." + h)), None)

    def url_rule(self, host: str, path: str) -> str | None:
        """What denies the URL of `host` and `path`: ``host:NAME`` or ``url:HOST/PATH``, else None."""
        if rule := self.host_rule(host):
            return f"host:{rule}"
        entry = next((e for e in self.urls if e.covers(host, path)), None)
        return f"url:{entry.host}{entry.path}" if entry else None

    @property
    def url_hosts(self) -> tuple[str, ...]:
        """The hosts of the URL entries and their ``www.`` names: whose addresses are reached
        only under these names (`listed_address_rule`)."""
        return tuple(dict.fromkeys(name for e in self.urls for name in (e.host, f"www.{e.host}")))

    def listed_address_rule(self, name: str, address: str, listed: frozenset[str]) -> str | None:
        """Why connecting to `address` for the destination `name` is refused, else None: it is
        an address of a URL entry's host (`listed`, looked up when the interceptor starts) named
        otherwise (an address literal, another name): its path rules hold only under its name."""
        if address in listed and host_key(name) not in {e.host for e in self.urls}:
            return f"address of a blocked_urls host ({address}) reached as {name}"
        return None


def is_host_local(address: str) -> bool:
    """Whether `address` is loopback, unspecified or link-local: the interceptor's host itself
    (the caller checks the host's other addresses by binding to them)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or ip.is_link_local
