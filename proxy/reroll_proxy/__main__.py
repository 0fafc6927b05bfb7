"""Run the LLM proxy until SIGTERM.

- ``python -m reroll_proxy --config FILE [--ready-file F]``: one rollout's proxy. The config is a
  JSON `reroll_contracts.proxy.ProxyConfig`, where ``upstream.api_key_env`` and
  ``controller_token_env`` name the environment variables holding the upstream key and the token
  that opens ``/_reroll/*``.
- ``python -m reroll_proxy --shared --admin-token-env NAME [--listen-host H] [--ready-file F]``:
  a proxy for any number of rollouts, each added with a `reroll_contracts.proxy.RolloutRegistration`
  (``POST /_reroll/rollouts`` with the admin token held by the variable NAME) and removed with
  ``DELETE /_reroll/rollouts/{rollout_id}`` (`reroll_proxy.host.ProxyHost`); and the scripted
  model for any number of scripts, added on ``/_reroll/scripts`` with the same token
  (`reroll_proxy.scripted.SharedScripts`, on a port of its own): one process, one interpreter's
  start, for both.

Once listening, the proxy writes its `reroll_contracts.proxy.ReadyFile` (``{"pid", "address"}``,
the address its base URL). Exit code 2: the config, the replayed trajectory or the fault plan is
invalid, or the admin token's variable is unset (the message on stderr names the file or variable).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from reroll_contracts.childenv import hide_from_same_user
from reroll_contracts.errors import ConfigError
from reroll_contracts.proxy import ProxyConfig
from reroll_contracts.service import run_service

from reroll_proxy.config import load_config
from reroll_proxy.scripted import SharedScripts
from reroll_proxy.server import start_proxy, start_shared


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the proxy until SIGTERM / SIGINT.

    Returns:
        The process exit code: 0 after a signal, 2 on an invalid config, trajectory or fault plan.
    """
    parser = argparse.ArgumentParser(prog="python -m reroll_proxy", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--config", type=Path, help="JSON proxy config file (one rollout)")
    mode.add_argument("--shared", action="store_true", help="serve rollouts added over /_reroll/rollouts")
    parser.add_argument("--admin-token-env", help="--shared: the variable holding the admin token")
    parser.add_argument("--listen-host", default="127.0.0.1", help="--shared: the control site's interface")
    parser.add_argument("--ready-file", type=Path, help="overrides the config's ready_file")
    args = parser.parse_args(argv)
    hide_from_same_user()  # its environment holds the provider key (`reroll_contracts.childenv`)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.shared:
        token = os.environ.get(args.admin_token_env or "", "")
        if not token:
            print(
                "reroll_proxy: error: --shared needs --admin-token-env naming a set variable", file=sys.stderr
            )
            return 2
        run_service(lambda: _serve_shared(args.listen_host, token, args.ready_file))
        return 0
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


async def _serve_shared(host: str, admin_token: str, ready_file: Path | None) -> None:
    scripts = SharedScripts()  # the scripted model, started before the ready file announces it
    await scripts.start(host)
    try:
        proxy_host = await start_shared(host, admin_token, ready_file, scripts.admin_routes())
        try:
            await asyncio.Event().wait()
        finally:
            await proxy_host.stop()
    finally:
        await scripts.stop()


if __name__ == "__main__":
    sys.exit(main())
