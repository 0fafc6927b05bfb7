"""Backends from outside reroll's registry, loaded by dotted path in `test_base`: the `local-plain`
backend under another name (conforms), and one whose restore forgets to restore (does not)."""

from __future__ import annotations

from reroll.sandbox.local.plain import LocalSandbox


class PluginSandbox(LocalSandbox):
    """Out-of-tree backend: reroll's `local-plain`, named ``tests.sandbox.plugin_backend:PluginSandbox``."""


class ForgetfulSandbox(LocalSandbox):
    """A broken backend: `restore` answers as if it restored, and changes nothing."""

    async def restore(self, name: str) -> list[str]:
        return [self.layout.workspace]
