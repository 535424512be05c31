"""`conductor`: one CLI, one subcommand module per area.

Each module in `SUBCOMMANDS` exposes `register(subparsers)`, which adds its
parsers and sets `func` (a callable taking the parsed namespace and returning
an exit code) on each leaf.

Bad input (a file, standard input, an argument's value) is refused through
`worker.inputs`: a command raises `InputError` before anything is sent, and
`run` prints its one line as `conductor: <message>` and exits 2.

Global options, before the subcommand, as the `temporal` CLI has them: `--version`, and the
connection flags `--address HOST:PORT`, `--namespace NS`, `--profile NAME`, checked before any
command runs (a bad value: one line, exit 2) and applied by `worker.connection` to every
command that connects (flag > TEMPORAL_* variable > profile file > default).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tomllib
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from activities.store_errors import StoreUnavailable
from worker.connection import ConnectionFlags, ConnectionSettingError, using_flags
from worker.inputs import InputError
from worker.process import exit_now

DISTRIBUTION = "mission-conductor"

# command -> the module that registers it. A command line that names one imports only its module:
# `conductor admission run -- CMD` starts its command that much sooner (bench/admission_holders.py).
SUBCOMMANDS = {
    "contract": "worker.cli.contract",
    "admission": "worker.cli.admission",
    "mission": "worker.cli.mission",
    "ledger": "worker.cli.ledger",
    "substrate": "worker.cli.substrate",
    "dev": "worker.cli.dev",
    "worker": "worker.cli.worker_cmd",
    "search-attributes": "worker.cli.search_attributes",
    "demo": "worker.cli.demo",
    "replay": "worker.cli.replay",
    "completion": "worker.cli.completion",
}

# The global options that take a value, as the `temporal` CLI has them: flag, dest, metavar, help.
CONNECTION_OPTIONS = (
    ("--address", "temporal_address", "HOST:PORT", "Temporal frontend address"),
    ("--namespace", "temporal_namespace", "NS", "Temporal namespace"),
    ("--profile", "temporal_profile", "NAME", "environment-configuration profile"),
)

# Commands that start a Temporal server of their own: a connection flag would be silently ignored.
OWN_SERVER = frozenset({"dev", "demo"})


def version() -> str:
    """The installed distribution's version, else the source tree's pyproject.toml, else "unknown"."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        with (Path(__file__).resolve().parents[2] / "pyproject.toml").open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


class _VersionRequested(Exception):
    pass


class _VersionAction(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        raise _VersionRequested


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr and exit 2, like every other refusal (argparse prints
    the whole usage block first); the line names `--help` for the rest. Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _named_command(argv: Sequence[str]) -> str | None:
    """The command word of `argv` (the first word that is no global option or its value)."""
    words = iter(argv)
    for word in words:
        if word in {flag for flag, *_ in CONNECTION_OPTIONS}:
            next(words, None)
        elif not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole CLI's parser; for a command line that names a command, only that command's."""
    parser = OneLineParser(
        prog="conductor",
        description="Mission Conductor: run fleets of agentic workloads fairly and durably.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print conductor's version and exit")
    connection = parser.add_argument_group(
        "Temporal connection", "override the environment configuration (TEMPORAL_* variables, profile file)"
    )
    for flag, dest, metavar, help in CONNECTION_OPTIONS:
        connection.add_argument(flag, dest=dest, metavar=metavar, help=help)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _named_command(argv) if argv is not None else None
    for command, module_name in SUBCOMMANDS.items():
        if named is None or command == named:
            importlib.import_module(module_name).register(subparsers)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command; returns its exit code (used by tests)."""
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv).parse_args(argv)
    except _VersionRequested:
        print(f"conductor {version()}")
        return 0
    try:
        flags = ConnectionFlags.checked(args.temporal_address, args.temporal_namespace, args.temporal_profile)
        if args.command in OWN_SERVER and flags.given():
            raise InputError(
                f"{flags.given()[0]} does not apply to `conductor {args.command}`: it starts a Temporal server "
                f"of its own (see `conductor {args.command} --help`)"
            )
        with using_flags(flags):
            return int(args.func(args) or 0)
    except (InputError, ConnectionSettingError) as error:
        print(f"conductor: {error}", file=sys.stderr)
        return 2
    except StoreUnavailable as error:  # the configured database refused or is not there (e.g. a worker starting)
        print(f"conductor: {error}", file=sys.stderr)
        return 1


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
