"""The contracts shared by reroll's controller, proxy and sidecar.

`reroll_contracts.errors` (the exception tree, each class with the stable category that lands in
result.json) and `reroll_contracts.proxy` (the LLM proxy's config, status and ready files). They
import nothing of the controller, the proxy or the sidecar; all three import them.
"""
