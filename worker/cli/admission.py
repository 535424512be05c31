"""`conductor admission` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("admission", help="(under construction)")
