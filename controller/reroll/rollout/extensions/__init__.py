"""The features of a rollout, one module each, each an `reroll.rollout.hooks.Extension` registered in
`reroll.rollout.hooks.EXTENSIONS`: `skills`, `learner_store`, `ask_user`, `services` (services and
MCP), `checkpoints`, `interception`, `judges`, `persona`. Nothing of the rollout's core
(`reroll.rollout.start`, `reroll.rollout.lifecycle`) imports them; the registry loads them."""
