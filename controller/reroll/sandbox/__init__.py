"""Sandbox backends behind one `Sandbox` protocol (`reroll.sandbox.base`, with the registry).

A backend is made from a `reroll.sandbox.spec.SandboxSpec` (never the task: the rollout builds the
spec, `reroll.rollout.sandbox_spec`); what it may offer beyond the protocol — shared installs,
sibling service containers — and the types it returns for it are in `reroll.sandbox.seam`. This
package imports no plane above it (`reroll.environment`, `reroll.installs`, `reroll.tasks`).

- `local` (`reroll.sandbox.local.isolated`): Linux namespaces without Docker, the default;
  ``local-plain`` (`reroll.sandbox.local.plain`): a folder and a process tree, no isolation.
- `docker` (`reroll.sandbox.docker.backend`): one container per rollout, images built locally.
- A backend of another package: ``--sandbox package.module:Class``, checked by
  `reroll.conformance`.

Every reroll backend talks to the sidecar inside its sandbox through the same client
(`reroll.sandbox.sidecar_client`, `reroll.sandbox.sidecar_sandbox`) and ships it as one
self-contained executable (`reroll.sandbox.sidecar_bundle`).
"""
