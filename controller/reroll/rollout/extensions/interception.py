"""Interception as a rollout extension: for an agent with ``proxy_mode: intercept`` (one that
ignores base-URL variables), the HTTPS interceptor (mitmproxy) in front of the LLM proxy, its port
opened to the sandbox, its CA put into the sandbox and the agent sent through it
(`reroll.host.intercept`)."""

from __future__ import annotations

import urllib.parse

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
        if proxy is None or plan.agent.proxy_mode != "intercept":
            return
        run.console.print("[dim]starting the HTTPS interceptor (mitmproxy; installed on first use)[/dim]")
        interceptor = intercept.Interceptor(
            target=proxy.base_url,
            token=proxy.token,
            workdir=plan.paths.make_harness(),
            listen_host=await run.sandbox.host_address(),
            other_hosts="pass" if plan.task.spec.environment.network == "full" else "refuse",
        )
        await run.stack.enter_async_context(interceptor)
        await run.sandbox.allow_host_port(port_of(interceptor.proxy_url))
        self.interceptor = interceptor

    async def before_agent(self, run: Run) -> None:
        """Put the CA bundle into the sandbox at `INTERCEPT_CA_PATH`; send the agent through the
        interceptor (``HTTPS_PROXY``, the CA variables: `reroll.host.intercept.sandbox_env`), the
        proxy's own host left out of it."""
        if self.interceptor is None or run.proxy is None:
            return
        ca_path = run.sandbox.layout.path(INTERCEPT_CA_PATH)
        await run.sandbox.put_file(ca_path, intercept.ca_bundle())
        proxy_host = urllib.parse.urlsplit(run.proxy.base_url).hostname or ""
        run.agent_env |= intercept.sandbox_env(self.interceptor.proxy_url, ca_path, no_proxy=[proxy_host])
