"""`serve` command line: shared by `conductor substrate serve` and `python -m substrate serve`.

Tokens (`substrate/auth.py`): a token file with roles (`--token-file`, or
`CONDUCTOR_SUBSTRATE_TOKEN_FILE`), in the real server's TOML format, and/or the two-token
variables `CONDUCTOR_FLEET_TOKEN` (admin role) and `CONDUCTOR_EXECUTOR_TOKEN` (operator role),
or their `_FILE` variants, or `--fleet-token-file` / `--executor-token-file`. There is
deliberately no option that takes a token value, since argv is visible to every user of the
machine. An unusable token file is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from substrate.auth import TokenError, load_tokens
from substrate.config import DEFAULT_DATA_DIR, DEFAULT_HOST, DEFAULT_PORT, SubstrateConfig
from substrate.server import READY_PREFIX, serve


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port, 0 for a free one (default {DEFAULT_PORT})")
    parser.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR, help=f"SQLite file and task outputs (default {DEFAULT_DATA_DIR})"
    )
    parser.add_argument("--instances", type=int, default=1, help="executor instances local-1..local-N (default 1)")
    parser.add_argument(
        "--token-file", type=Path, help="TOML file of [[tokens]] entries, each with token and role (admin or operator)"
    )
    parser.add_argument("--fleet-token-file", type=Path, help="file holding one admin-role token (the fleet plane's)")
    parser.add_argument(
        "--executor-token-file", type=Path, help="file holding one operator-role token (the executor plane's)"
    )
    parser.add_argument(
        "--no-fleet", action="store_true",
        help="play an Agentic Sandbox without the fleet API: 404 on /api/v2/fleet/*, A2A tasks only",
    )
    parser.add_argument(
        "--stop-workloads-on-exit",
        action="store_true",
        help="kill workload processes when stopped cleanly (default: leave them running; the next start re-adopts them)",
    )
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    try:
        tokens = load_tokens(
            token_file=args.token_file,
            fleet_token_file=args.fleet_token_file,
            executor_token_file=args.executor_token_file,
        )
        config = SubstrateConfig(
            tokens=tuple(tokens),
            data_dir=args.data_dir,
            instances=args.instances,
            host=args.host,
            port=args.port,
            keep_workloads_on_stop=not args.stop_workloads_on_exit,
            fleet_api=not args.no_fleet,
        )
    except (TokenError, ValueError) as error:
        print(f"conductor substrate: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def ready(url: str) -> None:
        names = ", ".join(f"local-{n}" for n in range(1, config.instances + 1))
        fleet = "" if config.fleet_api else "; no fleet API"
        print(f"{READY_PREFIX}{url} (instances {names}; data {config.data_dir}{fleet})", flush=True)

    try:
        serve(config, ready=ready)
    except OSError as error:
        print(f"conductor substrate: cannot listen on {config.host}:{config.port}: {error.strerror}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m substrate", allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_arguments(commands.add_parser("serve", help="run the local substrate", allow_abbrev=False))
    args = parser.parse_args(argv)
    return int(args.func(args))
