"""`conductor substrate serve`: the bundled local execution substrate (Agentic Sandbox API)."""

from __future__ import annotations

import argparse

from substrate.cli import add_serve_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    substrate = subparsers.add_parser("substrate", help="the local execution substrate", allow_abbrev=False)
    commands = substrate.add_subparsers(dest="substrate_command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve the Agentic Sandbox fleet and A2A APIs, running workloads as local processes",
        description="Tokens: CONDUCTOR_FLEET_TOKEN and CONDUCTOR_EXECUTOR_TOKEN (or *_FILE), "
        "or --fleet-token-file / --executor-token-file. They must differ.",
        allow_abbrev=False,
    )
    add_serve_arguments(serve)
