"""reroll's LLM proxy: records, replays and cuts over agents' LLM exchanges (one process per host).

Modules: `engine`, `threads`, `divergence`, `volatile` (the pure record/replay/divergence logic),
`retries` (SDK retries told from new turns), `translate`, `chat_anthropic`, `responses_chat`
(translation between API formats), `faults` and `inject` (fault injection), `recorder` (durable
appends), `respond` (serving a step), `asks` (the ask_user desk), `server`, `config`, `limits`,
`front`, `messages`, `endpoints_models`, `endpoints_websocket` (the HTTP front end), `intercept`
(the mitmproxy addon); ``python -m reroll_proxy``. `scripted` and `scripted_answers` are the bundled scripted
model server, a process of its own (``python -m reroll_proxy.scripted``). The API formats, SSE
and the files it shares with the controller are `reroll_contracts`'s.
"""
