"""The contracts shared by reroll's controller, proxy and sidecar.

`reroll_contracts.errors` (the exception tree, each class with the stable category that lands in
result.json), `reroll_contracts.proxy` (the LLM proxy's config, status and ready files),
`reroll_contracts.trajectory` (the exchange line the proxy writes and the run folder reads) and
`reroll_contracts.faults` (the fault plan file and the fault notes of exchange lines),
`reroll_contracts.wire` (the providers' API formats and server-sent events, as the proxy records
them and run-folder readers read them), `reroll_contracts.retries` (which recorded attempts a
replay skips) and `reroll_contracts.service` (the ready-file handshake and run loop of a host-side
service process: the proxy, the scripted model server). They
import nothing of the controller, the proxy or the sidecar; all three import them.
"""
