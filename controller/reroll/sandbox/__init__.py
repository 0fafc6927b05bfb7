"""Sandbox backends: subclasses of one `Sandbox` class (`reroll.sandbox.base`, with the registry).

Every operation inside a sandbox (exec, files, kill, snapshots, verify) is written once, as an
RPC to the sidecar inside it (`reroll.sandbox.sidecar_client.SidecarClient`, which `Sandbox`
inherits); a backend supplies only its lifecycle, the host's side of the network and the limits
it hit. Paths inside a sandbox: `reroll.sandbox.layout`.

A backend is made from a `reroll.sandbox.spec.SandboxSpec` (never the task: the rollout builds the
spec, `reroll.rollout.sandbox_spec`); what it may offer beyond `Sandbox` — shared installs,
sibling service containers — and the types it returns for it are in `reroll.sandbox.seam`. This
package imports no plane above it (`reroll.environment`, `reroll.installs`, `reroll.tasks`).

- `local` (`reroll.sandbox.local.isolated`): Linux namespaces without Docker, the default;
  ``local-plain`` (`reroll.sandbox.local.plain`): a folder and a process tree, no isolation.
- `docker` (`reroll.sandbox.docker.backend`): one container per rollout, images built locally.
- A backend of another package: ``--sandbox package.module:Class``, checked by
  `reroll.conformance`.

Every reroll backend ships the sidecar as one self-contained executable
(`reroll.sandbox.sidecar_bundle`).
"""
