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

Only mitmproxy and the standard library are imported here (see the package docstring).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import urllib.parse
from pathlib import Path

from mitmproxy import ctx, http

TOKEN_ENV = "REROLL_INTERCEPT_TOKEN"
DEFAULT_HOSTS = "api.openai.com,api.anthropic.com"


class RerollIntercept:
    """Routes provider traffic to the LLM proxy and polices every other host."""

    def __init__(self) -> None:
        self.token = os.environ.get(TOKEN_ENV, "")

    def load(self, loader: object) -> None:
        add = loader.add_option  # type: ignore[attr-defined]
        add("reroll_target", str, "", "The LLM proxy's root URL, http://HOST:PORT.")
        add("reroll_hosts", str, DEFAULT_HOSTS, "Comma-separated provider hosts sent to the target.")
        add("reroll_other_hosts", str, "refuse", "Other hosts: pass (through) or refuse (403).")
        add("reroll_ready_file", str, "", "Where to write the listen address once running.")

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

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A CONNECT tunnel: refused for other hosts under ``refuse``."""
        if not self._is_provider(flow.request.host) and ctx.options.reroll_other_hosts != "pass":
            self._refuse(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        """Send provider requests to the LLM proxy with the rollout token; police the others."""
        if not self._is_provider(flow.request.pretty_host):
            if ctx.options.reroll_other_hosts != "pass":
                self._refuse(flow)
            return
        target = urllib.parse.urlsplit(ctx.options.reroll_target)
        flow.request.scheme = "http"
        flow.request.host = target.hostname or "127.0.0.1"
        flow.request.port = target.port or 80
        flow.request.headers["authorization"] = f"Bearer {self.token}"
        if "x-api-key" in flow.request.headers:
            flow.request.headers["x-api-key"] = self.token

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream every response body through as it arrives (SSE first bytes unbuffered)."""
        assert flow.response is not None
        flow.response.stream = True


addons = [RerollIntercept()]


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run mitmdump with this addon until SIGTERM."""
    parser = argparse.ArgumentParser(prog="addon.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the LLM proxy's root URL, http://HOST:PORT")
    parser.add_argument("--listen-host", default="127.0.0.1")
    parser.add_argument("--hosts", default=DEFAULT_HOSTS, help="comma-separated provider hosts")
    parser.add_argument("--other-hosts", choices=["pass", "refuse"], default="refuse")
    parser.add_argument("--confdir", required=True, help="mitmproxy's confdir, holding the CA")
    parser.add_argument("--ready-file", required=True)
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
    }
    sets = [item for key, value in options.items() for item in ("--set", f"{key}={value}")]
    # TLS of other hosts is never intercepted: passed through as TCP, or refused at CONNECT.
    provider = "|".join(re.escape(host.strip()) for host in args.hosts.split(",") if host.strip())
    mitmdump(["--quiet", "-s", __file__, "--allow-hosts", rf"^({provider}):\d+$", *sets])


if __name__ == "__main__":
    main()
