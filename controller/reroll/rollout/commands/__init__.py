"""The commands that start rollouts, one module each: `record` (``reroll run``), `continue_`
(``reroll continue``), `replay` (``reroll replay``: a fidelity check) and `rescore` (``reroll
rescore``). Each picks an origin, a live model and a provenance, and calls
`reroll.rollout.start.start_rollout`."""
