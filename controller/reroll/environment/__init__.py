"""The environment plane of a rollout (DESIGN.md, "The environment plane"): what the task declares
of the world the agent acts in, run inside the rollout's sandbox through the sandbox seam.

- `reroll.environment.services`: the task's services, started in dependency order, gated on
  readiness and watched (`Environment`); image services through a backend's
  `reroll.sandbox.seam.SiblingServices`.
- `reroll.environment.state`: the environment's state, snapshotted, restored and queried
  (root side: `reroll.environment.state_script`).

Above `reroll.sandbox` (it drives sandboxes, no backend imports it), below `reroll.rollout`.
"""
