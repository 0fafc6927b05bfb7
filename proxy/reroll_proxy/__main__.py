"""``python -m reroll_proxy --config FILE [--ready-file F]``: run one rollout's proxy until SIGTERM.

The config is a JSON `reroll_contracts.proxy.ProxyConfig`, where ``upstream.api_key_env`` and
``controller_token_env`` name the environment variables holding the upstream key and the token
that opens ``/_reroll/*``. Once listening, the proxy writes its
`reroll_contracts.proxy.ReadyFile` (``{"pid", "address"}``, the address its base URL). Exit code
2: the config, the replayed trajectory or the fault plan is invalid (the message on stderr names the file).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from reroll_contracts.childenv import hide_from_same_user
from reroll_contracts.errors import ConfigError
from reroll_contracts.proxy import ProxyConfig

from reroll_proxy.config import load_config
from reroll_proxy.runtime import run_service
from reroll_proxy.server import start_proxy


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the proxy until SIGTERM / SIGINT.

    Returns:
        The process exit code: 0 after a signal, 2 on an invalid config, trajectory or fault plan.
    """
    parser = argparse.ArgumentParser(prog="python -m reroll_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="JSON proxy config file")
    parser.add_argument("--ready-file", type=Path, help="overrides the config's ready_file")
    args = parser.parse_args(argv)
    hide_from_same_user()  # its environment holds the provider key (`reroll_contracts.childenv`)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        if args.ready_file is not None:
            config = config.model_copy(update={"ready_file": args.ready_file})
        run_service(lambda: _serve(config))
    except (ConfigError, FileNotFoundError) as exc:  # a bad config, trajectory or fault plan
        print(f"reroll_proxy: error: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(config: ProxyConfig) -> None:
    proxy = await start_proxy(config)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()


if __name__ == "__main__":
    sys.exit(main())
