"""An agent with the provider's URL hard-coded: one of `sdk_agents` with the SDK's default base URL.

``python -m tests.proxy.intercept_client FORMAT TURNS [--stream] [--async]`` runs the agent
(with a made-up API key) and prints its `Transcript` as JSON. Run it with the environment a
sandbox gets under ``proxy_mode: intercept`` (``HTTPS_PROXY``, ``SSL_CERT_FILE``...) and nothing
that names a base URL.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

from tests.proxy.sdk_agents import AGENTS

HARD_CODED_KEY = "sk-hard-coded-in-the-agent"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("format", choices=list(AGENTS))
    parser.add_argument("turns", type=int)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args()
    agent = AGENTS[args.format](None, HARD_CODED_KEY, use_async=args.use_async)
    transcript = asyncio.run(agent.run(args.turns, stream=args.stream))
    print(json.dumps(dataclasses.asdict(transcript)))


if __name__ == "__main__":
    main()
