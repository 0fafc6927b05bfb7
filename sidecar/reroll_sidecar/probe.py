"""``reroll-sidecar probe TARGET [--timeout SECONDS]``: one readiness probe of a task's service,
run inside the sandbox (its network namespace) by the controller (`reroll.environment.services`), so
it needs no tool of the image (a busybox image has no curl).

TARGET is ``http://HOST:PORT/PATH`` (or ``https://``): healthy when a GET answers 2xx (redirects
are not followed); or ``tcp://HOST:PORT``: healthy when a connection is accepted. Exit 0 when
healthy, 1 when not (the reason on stdout), 2 for a bad target.
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def probe(target: str, timeout: float) -> tuple[bool, str]:
    """Probe `target` once within `timeout` seconds: (healthy, what was seen).

    Raises:
        ValueError: `target` is neither an http(s) URL nor ``tcp://HOST:PORT``.
    """
    parts = urllib.parse.urlsplit(target)
    if parts.scheme == "tcp":
        if not parts.hostname or parts.port is None:
            raise ValueError(f"not tcp://HOST:PORT: {target}")
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
                return True, f"connected to {parts.hostname}:{parts.port}"
        except OSError as exc:
            return False, f"cannot connect to {parts.hostname}:{parts.port}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL or tcp://HOST:PORT: {target}")
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(target, method="GET"), timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (OSError, ValueError) as exc:
        return False, f"GET {target}: {exc}"
    return 200 <= status < 300, f"GET {target}: HTTP {status}"


def main(argv: list[str]) -> int:
    """The ``probe`` command line; see the module docstring for the exit codes."""
    parser = argparse.ArgumentParser(prog="reroll-sidecar probe", description="One readiness probe.")
    parser.add_argument("target", help="http://HOST:PORT/PATH or tcp://HOST:PORT")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds [5]")
    args = parser.parse_args(argv)
    try:
        healthy, seen = probe(args.target, args.timeout)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(seen)
    return 0 if healthy else 1
