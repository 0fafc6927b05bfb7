"""Interception as a rollout extension: the HTTPS interceptor (mitmproxy, `reroll.host.intercept`)
for an agent with ``proxy_mode: intercept`` (one that ignores base-URL variables) in front of the
LLM proxy, and for an agent phase with URL prefixes denied (BenchFlow's ``blocked_urls``: the
phase runs under ``none`` and reaches the outside only through it, which answers 403 under them);
its port opened to the sandbox, its CA put into the sandbox and the agent sent through it."""

from __future__ import annotations

import urllib.parse

from reroll.cache import host_ca_bundle
from reroll.host import intercept
from reroll.rollout.hooks import Extension, Run
from reroll.rollout.llm_side import port_of

INTERCEPT_CA_PATH = "/etc/reroll/intercept-ca.pem"
"""Where the CA bundle of an intercepted agent goes (under the sandbox root)."""


class Interception(Extension):
    """Reads the first agent's ``proxy_mode`` and the task's network."""

    def __init__(self) -> None:
        self.interceptor: intercept.Interceptor | None = None

    async def before_sandbox_start(self, run: Run) -> None:
        """Start the interceptor (stopped with the rollout) and open its port to the sandbox.

        Raises:
            InfrastructureError: the interceptor did not start.
        """
        proxy, plan = run.proxy, run.plan
        networks = plan.task.spec.networks()
        urls = networks.agent_blocked_urls if networks.agent == "none" else ()
        routed = proxy is not None and plan.agent.proxy_mode == "intercept"
        if not (routed or urls):
            return
        denylist = intercept.DenyList(networks.agent_denied, urls) if urls else None
        run.console.print("[dim]starting the HTTPS interceptor (mitmproxy; installed on first use)[/dim]")
        interceptor = intercept.Interceptor(
            target=proxy.base_url if proxy is not None else None,
            token=proxy.token if proxy is not None else "",
            workdir=plan.paths.make_harness(),
            listen_host=await run.sandbox.host_address(),
            other_hosts="pass" if plan.task.spec.environment.network == "full" else "refuse",
            hosts=intercept.PROVIDER_HOSTS if routed else (),
            denylist=denylist,
            upstream_ca=host_ca_bundle() if denylist else None,
        )
        await run.stack.enter_async_context(interceptor)
        await run.sandbox.allow_host_port(port_of(interceptor.proxy_url))
        self.interceptor = interceptor

    async def before_agent(self, run: Run) -> None:
        """Put the CA bundle into the sandbox at `INTERCEPT_CA_PATH`; send the agent through the
        interceptor (``HTTPS_PROXY``, the CA variables: `reroll.host.intercept.sandbox_env`), the
        LLM proxy's own host left out of it."""
        if self.interceptor is None:
            return
        ca_path = run.sandbox.layout.path(INTERCEPT_CA_PATH)
        await run.sandbox.put_file(ca_path, intercept.ca_bundle())
        direct = [urllib.parse.urlsplit(run.proxy.base_url).hostname or ""] if run.proxy is not None else []
        run.agent_env |= intercept.sandbox_env(self.interceptor.proxy_url, ca_path, no_proxy=direct)
