"""Command line of the sidecar: ``python -m reroll_sidecar --listen ADDRESS [options]``, or
``python -m reroll_sidecar probe TARGET`` for one readiness probe (`reroll_sidecar.probe`), or
``python -m reroll_sidecar guard ...`` for a guarded test run (`reroll_sidecar.guard`), or
``python -m reroll_sidecar ns-exec -- ARGV`` for a verify in namespaces of its own
(`reroll_sidecar.verify_ns`).

The auth token comes from ``--token-file`` or the environment variable ``REROLL_SIDECAR_TOKEN``,
which is removed from the environment so that the commands the sidecar runs never see it. Run
as a bundle (`reroll_sidecar.bundle`), the launcher's variables are removed too.

gRPC's fork handlers are turned off (``GRPC_ENABLE_FORK_SUPPORT=false``, which the commands
inherit): a child started as another user is forked (not vforked) before it switches user, and
gRPC's handlers then crash it now and then; the sidecar's children only exec, they need none.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from reroll_sidecar import bundle

TOKEN_ENV = "REROLL_SIDECAR_TOKEN"
DEFAULT_STATE_DIR = "/var/lib/reroll-sidecar"


def _token(token_file: str | None) -> str:
    """The token from `token_file` (stripped) or from the environment; empty when neither has one."""
    from_env = os.environ.pop(TOKEN_ENV, "")
    if token_file is None:
        return from_env.strip()
    with open(token_file, encoding="utf-8") as handle:
        return handle.read().strip()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve until SIGTERM/SIGINT.

    Returns:
        The exit code: 0 after a clean stop, 2 for a usage error (such as a missing token).
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:
        from reroll_sidecar import probe

        return probe.main(argv[1:])
    if argv[:1] == ["guard"]:
        from reroll_sidecar import guard

        return guard.main(argv[1:])
    if argv[:1] == ["ns-exec"]:
        from reroll_sidecar import verify_ns

        return verify_ns.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m reroll_sidecar", description="The reroll sidecar daemon."
    )
    parser.add_argument(
        "--listen", required=True, help="unix:/path/s.sock or HOST:PORT (port 0: any free port)"
    )
    parser.add_argument("--ready-file", help='once listening, write {"address": ..., "pid": ...} here')
    parser.add_argument("--token-file", help=f"read the auth token from this file instead of ${TOKEN_ENV}")
    parser.add_argument(
        "--state-dir", default=DEFAULT_STATE_DIR, help=f"private folder for snapshots [{DEFAULT_STATE_DIR}]"
    )
    args = parser.parse_args(argv)
    bundle.scrub_environment()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s reroll-sidecar %(levelname)s %(message)s"
    )
    try:
        token = _token(args.token_file)
    except OSError as exc:
        parser.error(f"cannot read the token file: {exc}")
    if not token:
        parser.error(f"no auth token: set ${TOKEN_ENV} or pass --token-file PATH")
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"  # before gRPC loads; see the module docstring
    from reroll_sidecar.server import serve

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.listen, token, args.ready_file, args.state_dir))
    else:
        uvloop.run(serve(args.listen, token, args.ready_file, args.state_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
