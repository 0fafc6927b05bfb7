"""The LLM side of a rollout (`reroll.rollout.lifecycle`), on the host: the live model's
upstream and the LLM proxy that records (and replays) every exchange, with what may differ between
a recording and its replay (`volatile_rules`); its port opened to the sandbox (the HTTPS
interceptor of ``proxy_mode: intercept`` is an extension: `reroll.rollout.extensions.interception`).
"""

from __future__ import annotations

import contextlib
import urllib.parse
from pathlib import Path

from reroll_contracts.proxy import VolatileRule

from reroll.host.llm_proxy import LlmProxy, prestart_proxy
from reroll.models.spec import live_upstream
from reroll.rollout.plan import RolloutPlan
from reroll.sandbox.base import Sandbox
from reroll.sandbox.layout import SandboxLayout


async def start_llm_side(
    plan: RolloutPlan,
    sandbox: Sandbox,
    stack: contextlib.AsyncExitStack,
    harness_dir: Path,
) -> LlmProxy | None:
    """Start the live model and the LLM proxy (the shared one's process at once:
    `reroll.host.llm_proxy.prestart_proxy`), each stopped by `stack`, and open the proxy's port to
    `sandbox` (created; perhaps starting meanwhile, `reroll.rollout.lifecycle`: the volatile
    sandbox paths are read from its layout before then, as when it started after).

    Returns:
        The proxy; None for an agent that calls no model.

    Raises:
        ModelError: the live model cannot be resolved or started (`reroll.models.spec`).
        InfrastructureError: the proxy did not start.
    """
    if plan.agent.api_format == "none":
        return None
    prestart_proxy()  # while the model server starts
    volatile = volatile_rules(plan, sandbox.layout)  # before any await: the layout before the start
    upstream = None
    if (live_model := plan.live_model) is not None:
        upstream = await stack.enter_async_context(live_upstream(live_model, harness_dir))
    host = await sandbox.host_address()
    proxy = LlmProxy(
        workdir=harness_dir,
        trajectory_path=plan.paths.trajectory,
        upstream=upstream,
        replay=plan.replay,
        listen_host=host,
        faults=plan.config.faults,
        volatile=volatile,
        hold_every=plan.hold_every,
        max_steps=plan.config.max_steps,
        token=plan.proxy_token,
    )
    await stack.enter_async_context(proxy)
    await sandbox.allow_host_port(port_of(proxy.base_url))
    return proxy


def port_of(url: str) -> int:
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
