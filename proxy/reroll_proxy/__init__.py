"""reroll's LLM proxy: records, replays and cuts over an agent's LLM exchanges (one process per rollout).

Modules: `exchange` (the trajectory line format), `sse` (event streams), `divergence` and
`engine` (pure record/replay logic), `recorder` (durable appends), `contract` (the typed messages
between controller and proxy: config, status, stop, ready file), `config` (reading the config),
`server` (the aiohttp front end, `start_proxy`), `runtime` (process plumbing);
``python -m reroll_proxy``.
"""
