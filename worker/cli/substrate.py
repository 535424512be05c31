"""`conductor substrate serve` (the bundled local substrate) and `conductor substrate check URL`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from activities.credentials import MissingCredential, executor_token, fleet_token
from substrate.cli import add_serve_arguments
from worker.substrate_check import FAIL, BadArguments, Check, check_url, run_checks


def register(subparsers: argparse._SubParsersAction) -> None:
    substrate = subparsers.add_parser("substrate", help="the local execution substrate", allow_abbrev=False)
    commands = substrate.add_subparsers(dest="substrate_command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve the Agentic Sandbox fleet and A2A APIs, running workloads as local processes",
        description="Tokens: --token-file (TOML [[tokens]] entries with token and role, admin or operator), "
        "and/or CONDUCTOR_FLEET_TOKEN (admin) and CONDUCTOR_EXECUTOR_TOKEN (operator), or their *_FILE "
        "variants, or --fleet-token-file / --executor-token-file. The fleet plane needs an admin token; "
        "the executor plane takes any valid one.",
        allow_abbrev=False,
    )
    add_serve_arguments(serve)
    check = commands.add_parser(
        "check",
        help="probe an Agentic Sandbox (health, both tokens, instances, an admit-replay-reconcile round trip)",
        description="Probes the Agentic Sandbox at URL with the worker's tokens before any worker points at it: "
        "health and readiness, the fleet token (admin role) and the executor token (accepted on /agents), the "
        "instance list, and an admit, replay and reconcile round trip on a throw-away child id that is never "
        "dispatched (then cancelled). One line per check; exit 0 when every check is ok, 1 otherwise, 2 on bad "
        "arguments. Tokens as the worker takes them: CONDUCTOR_FLEET_TOKEN / CONDUCTOR_EXECUTOR_TOKEN (or *_FILE), "
        "or the options below.",
        allow_abbrev=False,
    )
    check.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8122")
    check.add_argument("--fleet-token-file", type=Path, help="file holding the fleet (admin) token")
    check.add_argument("--executor-token-file", type=Path, help="file holding the executor (operator) token")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        url = check_url(args.url)
        if not args.timeout > 0:
            raise BadArguments(f"--timeout must be a positive number of seconds (got {args.timeout})")
        tokens = fleet_token(file=args.fleet_token_file), executor_token(file=args.executor_token_file)
    except (BadArguments, MissingCredential) as error:
        print(f"conductor substrate: check: {error}", file=sys.stderr)
        return 2

    def emit(check: Check) -> None:
        print(check.line(), flush=True)

    results = asyncio.run(run_checks(url, *tokens, timeout=args.timeout, emit=emit))
    return 1 if any(result.outcome == FAIL for result in results) else 0
