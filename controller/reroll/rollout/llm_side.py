"""The LLM side of a rollout (`reroll.rollout.lifecycle`), on the host: the live model's
upstream, the LLM proxy that records (and replays) every exchange, with what may differ between
a recording and its replay (`volatile_rules`), and for ``proxy_mode: intercept`` the HTTPS
interceptor in front of it; each listener's port opened to the sandbox.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from reroll_contracts.proxy import VolatileRule
from rich.console import Console

from reroll.host import intercept
from reroll.host.llm_proxy import LlmProxy
from reroll.models.spec import live_upstream
from reroll.runfolder.run import TRAJECTORY
from reroll.sandbox.base import Sandbox, SandboxLayout

if TYPE_CHECKING:
    from reroll.rollout.plan import RolloutPlan


async def start_llm_side(
    plan: RolloutPlan,
    sandbox: Sandbox,
    stack: contextlib.AsyncExitStack,
    harness_dir: Path,
    console: Console,
) -> tuple[LlmProxy | None, intercept.Interceptor | None]:
    """Start the live model, the LLM proxy and, for ``proxy_mode: intercept``, its HTTPS front end,
    each stopped by `stack`, and open their ports to `sandbox` (created, not yet started).

    Returns:
        The proxy and the interceptor (None unless ``proxy_mode: intercept``); (None, None) for
        an agent that calls no model.

    Raises:
        ModelError: the live model cannot be resolved or started (`reroll.models.spec`).
        InfrastructureError: the proxy or the interceptor did not start.
    """
    if plan.agent.api_format == "none":
        return None, None
    upstream = None
    if (live_model := plan.live_model) is not None:
        upstream = await stack.enter_async_context(live_upstream(live_model, harness_dir))
    host = await sandbox.host_address()
    proxy = LlmProxy(
        workdir=harness_dir,
        trajectory_path=plan.run_dir / TRAJECTORY,
        upstream=upstream,
        replay=plan.replay,
        listen_host=host,
        faults=plan.config.faults,
        volatile=volatile_rules(plan, sandbox.layout),
        hold_every=plan.checkpoint_every,
    )
    await stack.enter_async_context(proxy)
    await sandbox.allow_host_port(_port(proxy.base_url))
    if plan.agent.proxy_mode != "intercept":
        return proxy, None
    console.print("[dim]starting the HTTPS interceptor (mitmproxy; installed on first use)[/dim]")
    interceptor = intercept.Interceptor(
        target=proxy.base_url,
        token=proxy.token,
        workdir=harness_dir,
        listen_host=host,
        other_hosts="pass" if plan.task.spec.environment.network == "full" else "refuse",
    )
    await stack.enter_async_context(interceptor)
    await sandbox.allow_host_port(_port(interceptor.proxy_url))
    return proxy, interceptor


def _port(url: str) -> int:
    """The port of an ``http://HOST:PORT…`` URL of a listener reroll started."""
    port = urllib.parse.urlsplit(url).port
    assert port is not None, url
    return port


def volatile_rules(plan: RolloutPlan, layout: SandboxLayout) -> list[VolatileRule]:
    """What may differ between the recording and this rollout's requests (`reroll_proxy.volatile`).

    Args:
        plan: the rollout (its agents' declared rules, and the recorded sandbox's values when it replays).
        layout: this rollout's sandbox paths.

    Returns:
        One ``value`` rule per sandbox path (workspace, HOME, agents folder, sandbox root when it
        is not ``/``: written to ``harness/proxy.json``, where a later replay finds them), the
        recorded rollout's, then the agent's ``volatile`` declarations.
    """
    paths = {
        "workspace": layout.workspace,
        "home": layout.home,
        "agents": layout.agents_dir,
        "sandbox": layout.root if layout.root != "/" else "",
    }
    rules = [VolatileRule(value=path, label=label) for label, path in paths.items() if path]
    recorded = plan.recorded_values
    declared = [rule for agent in plan.agents.values() for rule in agent.volatile]
    return [*rules, *(rule for rule in recorded if rule not in rules), *declared]
