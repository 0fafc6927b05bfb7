"""Shared installs: agents and the Python runtime, installed once per store and read-only to every
rollout, checked against a manifest before each use.

- `reroll.installs.store`: the manifests, `InstallStore` (over a backend's
  `reroll.sandbox.seam.InstallFolders`), `ensure_installed` and `provide_runtime`.
- `reroll.installs.python_runtime`: the relocatable Python runtime uploaded for agents that need
  one the task's image lacks.

Above `reroll.sandbox` (installs run in a backend's installer sandbox, `reroll.sandbox.seam.SharedInstalls`),
below `reroll.rollout`.
"""
