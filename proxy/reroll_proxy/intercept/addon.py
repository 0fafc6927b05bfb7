"""A mitmproxy addon: HTTPS to the providers' hosts goes to the rollout's LLM proxy.

Run as ``PYTHON addon.py --target URL [--listen-host H] [--hosts A,B] [--other-hosts pass|refuse]
--confdir D --ready-file F`` with mitmproxy's interpreter; it starts ``mitmdump`` (regular proxy
mode, a free port) with itself as the script, and writes ``{"pid", "address"}`` (the
``http://HOST:PORT`` for ``HTTPS_PROXY``) to the ready file once listening: the shape of
`reroll_contracts.proxy.ReadyFile`, written with the standard library. The rollout token comes
from ``$REROLL_INTERCEPT_TOKEN``.

- A request to a provider host (``--hosts``; TLS intercepted with the CA of ``--confdir``) is sent
  over plain HTTP to ``--target``, the aiohttp proxy, with the same path (``/v1/chat/completions``,
  ``/v1/responses``, ``/v1/messages``), so the same record/replay engine serves it. Its
  credentials are replaced by the rollout token: an agent with a hard-coded or missing key works.
  Responses stream through unbuffered.
- Any other host: passed through untouched (``pass``, network policy ``full``) or refused with
  403 before any connection is made (``refuse``, policy ``none``; else the proxy would be a way
  out of a sandbox without network).
- With a deny list (``--blocked-hosts``, ``--blocked-urls``: JSON lists, a task's agent phase
  under BenchFlow's ``network_mode = "denylist"``, `url_denylist`), ``pass`` polices every host:
  TLS of every host is intercepted so that paths are seen; a request under a blocked URL or to a
  blocked host (by the name it is sent to or by its ``Host``) is answered 403 (header
  ``x-reroll-blocked: 1``) and logged to ``--blocked-log`` (JSON lines) without any connection
  made; a connection is opened only to an address looked up here and checked first (an address
  of a blocked host, of this host, or of a blocked URL's host named otherwise is refused), and
  to that address; non-HTTP traffic is refused (``rawtcp`` off).

Only mitmproxy, the standard library and `url_denylist` (standard library only) are imported here
(see the package docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import time
import urllib.parse
from pathlib import Path

from mitmproxy import ctx, http
from mitmproxy.proxy import server_hooks

try:  # reroll's environment (its tests, mypy)
    from reroll_proxy.intercept.url_denylist import UrlDenylist, is_host_local
except ImportError:  # run as a script by mitmproxy's interpreter: this folder is on sys.path
    from url_denylist import UrlDenylist, is_host_local  # type: ignore[no-redef]

TOKEN_ENV = "REROLL_INTERCEPT_TOKEN"
DEFAULT_HOSTS = "api.openai.com,api.anthropic.com"


class RerollIntercept:
    """Routes provider traffic to the LLM proxy and polices every other host."""

    def __init__(self) -> None:
        self.token = os.environ.get(TOKEN_ENV, "")
        self.denylist: UrlDenylist | None = None
        """The deny list (`configure`); None: no host is policed beyond ``--other-hosts``."""
        self.denied: frozenset[str] = frozenset()
        """The addresses of the blocked hosts, looked up at start."""
        self.listed: frozenset[str] = frozenset()
        """The addresses of the blocked URLs' hosts, looked up at start."""

    def load(self, loader: object) -> None:
        add = loader.add_option  # type: ignore[attr-defined]
        add("reroll_target", str, "", "The LLM proxy's root URL, http://HOST:PORT.")
        add("reroll_hosts", str, DEFAULT_HOSTS, "Comma-separated provider hosts sent to the target.")
        add("reroll_other_hosts", str, "refuse", "Other hosts: pass (through) or refuse (403).")
        add("reroll_ready_file", str, "", "Where to write the listen address once running.")
        add("reroll_blocked_hosts", str, "[]", "JSON list: hosts denied with their subdomains.")
        add("reroll_blocked_urls", str, "[]", "JSON list: URL prefixes denied.")
        add("reroll_blocked_log", str, "", "JSON-lines file of the requests refused by the deny list.")

    def configure(self, updated: set[str]) -> None:
        """Parse the deny list and look up its hosts' addresses (once, when it is set)."""
        if not {"reroll_blocked_hosts", "reroll_blocked_urls"} & updated:
            return
        hosts = json.loads(ctx.options.reroll_blocked_hosts)
        urls = json.loads(ctx.options.reroll_blocked_urls)
        self.denylist = UrlDenylist.parse(hosts, urls) if hosts or urls else None
        if self.denylist is not None:
            self.denied = frozenset(a for name in self.denylist.hosts for a in _addresses(name))
            self.listed = frozenset(a for name in self.denylist.url_hosts for a in _addresses(name))

    def _is_provider(self, host: str) -> bool:
        return host.lower() in {h.strip().lower() for h in ctx.options.reroll_hosts.split(",") if h.strip()}

    def _refuse(self, flow: http.HTTPFlow) -> None:
        host = flow.request.pretty_host
        message = f"reroll: {host} is not reachable from this sandbox (network policy none)\n"
        flow.response = http.Response.make(403, message.encode(), {"content-type": "text/plain"})

    def running(self) -> None:
        """Write the ready file: the port mitmdump listens on."""
        if not ctx.options.reroll_ready_file:
            return
        host, port = ctx.master.addons.get("proxyserver").listen_addrs()[0][:2]
        ready = {"pid": os.getpid(), "address": f"http://{host}:{port}"}  # a contract.ReadyFile
        path = Path(ctx.options.reroll_ready_file)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(ready))
        partial.replace(path)

    def _deny(self, flow: http.HTTPFlow, rule: str) -> None:
        """Answer 403 for the deny list's `rule` and log the request."""
        url = f"{flow.request.scheme}://{flow.request.pretty_host}{flow.request.path}"
        if flow.request.method == "CONNECT":
            url = f"{flow.request.host}:{flow.request.port}"
        message = f"reroll: {url} is blocked by the task's network policy ({rule})\n"
        flow.response = http.Response.make(
            403, message.encode(), {"content-type": "text/plain", "x-reroll-blocked": "1"}
        )
        if ctx.options.reroll_blocked_log:
            line = {"time": time.time(), "method": flow.request.method, "url": url, "rule": rule}
            with open(ctx.options.reroll_blocked_log, "a", encoding="utf-8") as log:
                log.write(json.dumps(line) + "\n")

    def _denied_by(self, flow: http.HTTPFlow) -> str | None:
        """The deny list's rule for `flow`'s request, by the host it goes to and by its ``Host``."""
        if self.denylist is None:
            return None
        names = dict.fromkeys([flow.request.host, flow.request.host_header or flow.request.host])
        for name in names:
            host = urllib.parse.urlsplit(f"//{name}").hostname or name
            if flow.request.method == "CONNECT":
                rule = self.denylist.host_rule(host)
                rule = rule and f"host:{rule}"
            else:
                rule = self.denylist.url_rule(host, flow.request.path)
            if rule:
                return rule
        return None

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A CONNECT tunnel: refused for other hosts under ``refuse``, for a blocked host."""
        if not self._is_provider(flow.request.host) and ctx.options.reroll_other_hosts != "pass":
            self._refuse(flow)
        elif rule := self._denied_by(flow):
            self._deny(flow, rule)

    def request(self, flow: http.HTTPFlow) -> None:
        """Send provider requests to the LLM proxy with the rollout token; police the others."""
        if not self._is_provider(flow.request.pretty_host):
            if ctx.options.reroll_other_hosts != "pass":
                self._refuse(flow)
            elif rule := self._denied_by(flow):
                self._deny(flow, rule)
            return
        target = urllib.parse.urlsplit(ctx.options.reroll_target)
        flow.request.scheme = "http"
        flow.request.host = target.hostname or "127.0.0.1"
        flow.request.port = target.port or 80
        flow.request.headers["authorization"] = f"Bearer {self.token}"
        if "x-api-key" in flow.request.headers:
            flow.request.headers["x-api-key"] = self.token

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Under a deny list: look the destination up here, refuse it when an address is not to
        be reached (`_address_rule`), else connect to the first address (no second lookup)."""
        if self.denylist is None or data.server.address is None:
            return
        name, port = data.server.address[:2]
        target = urllib.parse.urlsplit(ctx.options.reroll_target)
        if target.hostname and (name, port) == (target.hostname, target.port):
            return  # the LLM proxy, for a provider's request
        try:
            found = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            data.server.error = f"cannot resolve {name}: {exc}"
            return
        addresses = list(dict.fromkeys(str(entry[4][0]) for entry in found))
        for address in addresses:
            if rule := self._address_rule(name, address):
                data.server.error = f"reroll: {name}:{port} is blocked by the task's network policy ({rule})"
                return
        if data.server.sni is None and not _is_address(name):
            data.server.sni = name
        data.server.address = (addresses[0], port)

    def _address_rule(self, name: str, address: str) -> str | None:
        """Why `address` (of destination `name`) is refused under the deny list, else None."""
        assert self.denylist is not None
        if address in self.denied:
            return f"address of a blocked host ({address})"
        if is_host_local(address) or _is_this_host(address):
            return f"an address of the interceptor's host ({address})"
        return self.denylist.listed_address_rule(name, address, self.listed)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream every response body through as it arrives (SSE first bytes unbuffered)."""
        assert flow.response is not None
        flow.response.stream = True


addons = [RerollIntercept()]


def _addresses(name: str) -> list[str]:
    """The addresses `name` has here (none when it does not resolve)."""
    try:
        return list(dict.fromkeys(str(entry[4][0]) for entry in socket.getaddrinfo(name, None)))
    except OSError:
        return []


def _is_address(name: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
    except OSError:
        return False
    return True


def _is_this_host(address: str) -> bool:
    """Whether `address` is one of this host's own (a socket can be bound to it)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run mitmdump with this addon until SIGTERM."""
    parser = argparse.ArgumentParser(prog="addon.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="", help="the LLM proxy's root URL, http://HOST:PORT")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--hosts", default=DEFAULT_HOSTS, help="comma-separated provider hosts")
    parser.add_argument("--other-hosts", choices=["pass", "refuse"], default="refuse")
    parser.add_argument("--confdir", required=True, help="mitmproxy's confdir, holding the CA")
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--blocked-hosts", default="[]", help="JSON list: hosts denied (and subdomains)")
    parser.add_argument("--blocked-urls", default="[]", help="JSON list: URL prefixes denied")
    parser.add_argument("--blocked-log", default="", help="JSON-lines file of the refused requests")
    parser.add_argument("--upstream-ca", default="", help="CA bundle trusted upstream (default: certifi's)")
    args = parser.parse_args(argv)
    from mitmproxy.tools.main import mitmdump

    options = {
        "confdir": args.confdir,
        "listen_host": args.listen_host,
        "listen_port": "0",
        # Never contact a provider host: the upstream is the LLM proxy, decided per request.
        "connection_strategy": "lazy",
        "upstream_cert": "false",
        "flow_detail": "0",
        "termlog_verbosity": "warn",
        "reroll_target": args.target,
        "reroll_hosts": args.hosts,
        "reroll_other_hosts": args.other_hosts,
        "reroll_ready_file": args.ready_file,
        "reroll_blocked_hosts": args.blocked_hosts,
        "reroll_blocked_urls": args.blocked_urls,
        "reroll_blocked_log": args.blocked_log,
    }
    if args.upstream_ca:
        options["ssl_verify_upstream_trusted_ca"] = args.upstream_ca
    policed = json.loads(args.blocked_hosts) or json.loads(args.blocked_urls)
    if policed:  # every host's TLS intercepted, its paths seen; only HTTP(S) through
        options["rawtcp"] = "false"
    sets = [item for key, value in options.items() for item in ("--set", f"{key}={value}")]
    # Else TLS of other hosts is never intercepted: passed through as TCP, or refused at CONNECT.
    provider = "|".join(re.escape(host.strip()) for host in args.hosts.split(",") if host.strip())
    allow = [] if policed else ["--allow-hosts", rf"^({provider}):\d+$"]
    mitmdump(["--quiet", "-s", __file__, *allow, *sets])


if __name__ == "__main__":
    main()
