"""`conductor`: one CLI, one subcommand module per area.

Each module in `SUBCOMMANDS` exposes `register(subparsers)`, which adds its
parsers and sets `func` (a callable taking the parsed namespace and returning
an exit code) on each leaf.

Bad input (a file, standard input, an argument's value) is refused through
`worker.inputs`: a command raises `InputError` before anything is sent, and
`run` prints its one line as `conductor: <message>` and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from worker.inputs import InputError
from worker.process import exit_now

SUBCOMMANDS = (
    "worker.cli.contract",
    "worker.cli.admission",
    "worker.cli.mission",
    "worker.cli.substrate",
    "worker.cli.dev",
    "worker.cli.worker_cmd",
    "worker.cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conductor",
        description="Mission Conductor: run fleets of agentic workloads fairly and durably.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).register(subparsers)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command; returns its exit code (used by tests)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 2


def main() -> None:
    """Console-script entry point."""
    try:
        code = run(sys.argv[1:])
    except BrokenPipeError:  # `conductor ... | head`: the reader left; no traceback for that
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit fails otherwise
        code = 141  # as a tool killed by SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C that no command caught (while starting up, say): no traceback either
        print("conductor: interrupted", file=sys.stderr)
        code = 130  # as a tool killed by SIGINT
    exit_now(code)


if __name__ == "__main__":
    main()
