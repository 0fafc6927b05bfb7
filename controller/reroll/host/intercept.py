"""HTTPS interception: the mitmproxy front end of a rollout's LLM proxy (``proxy_mode: intercept``).

For agents that ignore base-URL variables and call ``https://api.openai.com`` or
``https://api.anthropic.com`` themselves. The sandbox gets ``HTTPS_PROXY`` pointing at a
``mitmdump`` on the host and a CA bundle (the host's CAs plus reroll's mitmproxy CA); the addon
``reroll_proxy/intercept/addon.py`` sends the providers' requests to the rollout's aiohttp proxy,
so they are recorded, replayed and cut over by the same engine as base-URL traffic.

mitmproxy (``MITMPROXY_REQUIREMENT``) pins an ``h11`` older than the one the openai and anthropic
SDKs need, so it lives in its own virtualenv under ``<cache>/mitmproxy/``, installed from PyPI
on first use (about 40 s) under a file lock, with the CA generated once beside it::

    async with Interceptor(target=proxy.base_url, token=proxy.token, workdir=d) as front:
        env = sandbox_env(front.proxy_url, "/etc/reroll/intercept-ca.pem", no_proxy=[proxy_host])
        # ... write ca_bundle() to that path in the sandbox, launch the agent with env
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from reroll_contracts.childenv import child_environment
from reroll_contracts.errors import InfrastructureError

from reroll.cache import cache_dir, cache_lock, host_ca_bundle
from reroll.host.child_process import ChildProcess

MITMPROXY_REQUIREMENT = "mitmproxy==11.0.2"
"""The newest mitmproxy that runs on Python 3.11."""
PROVIDER_HOSTS = ("api.openai.com", "api.anthropic.com")
"""Hosts whose traffic goes to the LLM proxy by default."""
INSTALL_TIMEOUT_SECONDS = 600.0
ADDON = resources.files("reroll_proxy.intercept") / "addon.py"
"""The addon script mitmproxy's interpreter runs (a file of the installed package)."""
_TOKEN_ENV = "REROLL_INTERCEPT_TOKEN"
OtherHosts = Literal["pass", "refuse"]
DENYLIST_LOG = "url_denylist.jsonl"
"""The requests a deny list refused, one JSON object a line (time, method, url, rule), in the
interceptor's workdir."""


@dataclass(frozen=True)
class DenyList:
    """What an agent phase may not reach through the interceptor (BenchFlow's ``blocked_hosts``
    and ``blocked_urls``, as `reroll.tasks.allowlist` spells them)."""

    hosts: tuple[str, ...] = ()
    """Hostnames, each with its subdomains."""
    urls: tuple[str, ...] = ()
    """URL prefixes (``https://host/path``; scheme and port ignored when matched)."""


def mitmproxy_home() -> Path:
    """``<cache>/mitmproxy/<requirement>``: the virtualenv (``venv/``) and the CA (``conf/``)."""
    return cache_dir() / "mitmproxy" / MITMPROXY_REQUIREMENT.replace("==", "-")


def ensure_mitmproxy() -> Path:
    """Install mitmproxy into its own virtualenv and create its CA, once per machine (blocking).

    Concurrent callers (rollouts, processes) wait on ``<cache>/mitmproxy/install.lock``.

    Returns:
        The virtualenv's Python interpreter.

    Raises:
        InfrastructureError: the virtualenv could not be created, or pip could not install
            `MITMPROXY_REQUIREMENT` (e.g. PyPI unreachable; the message has pip's output).
    """
    home = mitmproxy_home()
    python = _venv_python()
    if (home / ".installed").exists():
        return python
    home.mkdir(parents=True, exist_ok=True)
    with cache_lock("mitmproxy/install"):
        if (home / ".installed").exists():
            return python
        venv, conf = home / "venv", home / "conf"
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        make_ca = "import sys, mitmproxy.certs as c; c.CertStore.from_store(sys.argv[1], 'mitmproxy', 2048)"
        _run([sys.executable, "-m", "venv", "--clear", str(venv)], f"creating the virtualenv {venv}")
        _run([*pip, MITMPROXY_REQUIREMENT], f"installing {MITMPROXY_REQUIREMENT} from PyPI into {venv}")
        _run([str(python), "-c", make_ca, str(conf)], f"creating the mitmproxy CA in {conf}")
        (home / ".installed").touch()
    return python


def _venv_python() -> Path:
    return mitmproxy_home() / "venv" / "bin" / "python"


def ca_certificate() -> Path:
    """reroll's mitmproxy CA certificate (PEM); `ensure_mitmproxy` creates it."""
    return mitmproxy_home() / "conf" / "mitmproxy-ca-cert.pem"


def ca_bundle() -> bytes:
    """The bundle a sandbox trusts while intercepted: the host's CAs, then reroll's CA (PEM)."""
    host = host_ca_bundle()
    system = host.read_bytes().rstrip(b"\n") + b"\n" if host else b""
    return system + ca_certificate().read_bytes()


def sandbox_env(proxy_url: str, ca_path: str, no_proxy: list[str]) -> dict[str, str]:
    """The environment that sends a sandbox's HTTP(S) through the interceptor and trusts its CA.

    httpx (the openai and anthropic SDKs), requests, urllib, curl and Node read these; both
    spellings of the proxy variables are set because curl reads only the lower-case ``http_proxy``,
    and ``NODE_USE_ENV_PROXY=1`` makes Node's own ``fetch`` (Node 24+) use them. A client that
    ignores proxy variables is not intercepted (under policy ``none`` in a container it reaches
    nothing).

    Args:
        proxy_url: the interceptor's ``http://HOST:PORT`` as the sandbox reaches it.
        ca_path: the CA bundle's path in the sandbox (`ca_bundle` written there).
        no_proxy: hosts reached directly (the base-URL proxy's host); localhost is added.
    """
    bypass = ",".join(dict.fromkeys([*no_proxy, "localhost", "127.0.0.1"]))
    env = {
        "SSL_CERT_FILE": ca_path,
        "REQUESTS_CA_BUNDLE": ca_path,
        "CURL_CA_BUNDLE": ca_path,
        "NODE_EXTRA_CA_CERTS": ca_path,
        "NODE_USE_ENV_PROXY": "1",
    }
    for name, value in (("https_proxy", proxy_url), ("http_proxy", proxy_url), ("no_proxy", bypass)):
        env[name] = env[name.upper()] = value
    return env


class Interceptor:
    """One rollout's ``mitmdump`` in front of its LLM proxy (a child process of the controller).

    Args:
        target: the LLM proxy's base URL (``http://HOST:PORT/v1``; only host and port are used);
            None: no LLM proxy (an agent that calls no model; `hosts` is then empty).
        token: the rollout token the LLM proxy expects; set on every provider request.
        workdir: folder for the ready file and the log (``intercept.log``).
        listen_host: the interface to listen on, one the sandbox reaches (`Sandbox.host_address`).
        other_hosts: ``pass`` other hosts through (network policy ``full``) or ``refuse`` them.
        hosts: the provider hosts sent to the LLM proxy (empty: none, a deny list's interceptor
            in front of an agent that uses base URLs).
        denylist: a task's agent-phase deny list (`DenyList`): under ``pass``, every other
            host's TLS is intercepted and a request to a blocked host or under a blocked URL
            answered 403 (logged to ``<workdir>/url_denylist.jsonl``), the destinations checked
            by address (`reroll_proxy/intercept/addon.py`).
        upstream_ca: the CA bundle mitmdump trusts for the hosts it connects to (None:
            mitmproxy's own, certifi's).
    """

    def __init__(
        self,
        *,
        target: str | None,
        token: str,
        workdir: Path,
        listen_host: str = "127.0.0.1",
        other_hosts: OtherHosts = "refuse",
        hosts: tuple[str, ...] = PROVIDER_HOSTS,
        denylist: DenyList | None = None,
        upstream_ca: Path | None = None,
    ) -> None:
        url = urllib.parse.urlsplit(target or "")
        args = [
            "--target", f"http://{url.hostname}:{url.port}" if target else "",
            "--listen-host", listen_host,
            "--hosts", ",".join(hosts),
            "--other-hosts", other_hosts,
            "--confdir", str(mitmproxy_home() / "conf"),
        ]  # fmt: skip
        if denylist is not None:
            args += ["--blocked-hosts", json.dumps(list(denylist.hosts))]
            args += ["--blocked-urls", json.dumps(list(denylist.urls))]
            args += ["--blocked-log", str(workdir / DENYLIST_LOG)]
        if upstream_ca is not None:
            args += ["--upstream-ca", str(upstream_ca)]
        self._process = ChildProcess(
            "mitmdump",
            args,
            workdir=workdir,
            name="intercept",
            env=child_environment({_TOKEN_ENV: token}),  # the agent's user must not read ours
            command=[str(_venv_python()), str(ADDON)],
        )

    @property
    def proxy_url(self) -> str:
        """``http://HOST:PORT`` for ``HTTPS_PROXY``."""
        return self._process.ready.address

    async def start(self) -> None:
        """Install mitmproxy if needed (first use only), start mitmdump and wait until it listens.

        Raises:
            InfrastructureError: the install failed, or mitmdump did not start (with its log).
        """
        await asyncio.to_thread(ensure_mitmproxy)
        await self._process.start()

    async def stop(self) -> None:
        """Stop mitmdump."""
        await self._process.stop()

    async def __aenter__(self) -> Interceptor:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _run(argv: list[str], what: str) -> None:
    """Run one install step; raise InfrastructureError naming `what` with the end of its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfrastructureError(f"{what}: {exc}") from exc
    if done.returncode != 0:
        raise InfrastructureError(
            f"{what} failed (exit {done.returncode}); HTTPS interception needs PyPI once:\n"
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
