"""`conductor dev`: the whole local stack (Temporal dev server, substrate, worker) until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from worker.signals import stop_requested
from worker.stack import (
    DEFAULT_DATA_DIR,
    DEFAULT_INSTANCES,
    DEFAULT_SUBSTRATE_PORT,
    DEFAULT_TEMPORAL_PORT,
    DEFAULT_UI_PORT,
    DevStack,
    StackError,
    running_environment,
    shell_exports,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="run the local stack: Temporal dev server + Web UI, substrate and a worker, until Ctrl-C",
        description="Everything is kept in the data directory (SQLite), so a restart finds earlier missions. "
        "Ports default to the usual ones; a taken port is an error (0 picks a free one).",
        allow_abbrev=False,
    )
    options = (
        ("--data-dir", Path, DEFAULT_DATA_DIR, "state directory"),
        ("--port", int, DEFAULT_TEMPORAL_PORT, "Temporal gRPC port"),
        ("--ui-port", int, DEFAULT_UI_PORT, "Temporal Web UI port"),
        ("--substrate-port", int, DEFAULT_SUBSTRATE_PORT, "substrate port"),
        ("--instances", int, DEFAULT_INSTANCES, "substrate executor instances local-1..local-N"),
    )
    for flag, kind, default, what in options:
        dev.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    dev.add_argument(
        "action", nargs="?", choices=["env"], metavar="env",
        help="instead of starting a stack, print the exports that put this shell on the one running in the data "
        "directory: eval \"$(conductor dev env)\" (the `temporal` CLI follows too: TEMPORAL_ADDRESS, "
        "TEMPORAL_CONFIG_FILE)",
    )
    dev.set_defaults(func=run_dev)


def run_dev(args: argparse.Namespace) -> int:
    if args.action == "env":
        try:
            sys.stdout.write(shell_exports(running_environment(args.data_dir)))
        except StackError as error:
            print(f"conductor dev env: {error}", file=sys.stderr)
            return 1
        return 0
    try:
        stack = DevStack(
            args.data_dir,
            temporal_port=args.port,
            ui_port=args.ui_port,
            substrate_port=args.substrate_port,
            instances=args.instances,
        )
    except StackError as error:
        print(f"conductor dev: {error}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(stack))


async def _serve(stack: DevStack) -> int:
    with stop_requested() as stop:
        print(f"conductor dev: starting in {stack.data_dir} ...", flush=True)
        try:
            await stack.start()
        except StackError as error:
            print(f"conductor dev: {error}", file=sys.stderr)
            return 1
        try:
            if not stop.is_set():  # Ctrl-C during start-up: stop without announcing
                print(describe(stack), flush=True)
            failure = await _until_stopped_or_failed(stack, stop)
            print("conductor dev: stopping the worker, the substrate and Temporal ...", flush=True)
        finally:
            await stack.stop()
    if failure is not None:
        print(f"conductor dev: {failure}", file=sys.stderr)
        return 1
    print(f"conductor dev: stopped; state kept in {stack.data_dir}", flush=True)
    return 0


async def _until_stopped_or_failed(stack: DevStack, stop: asyncio.Event, interval: float = 1.0) -> str | None:
    """None once asked to stop; a message if a server died under the stack (the rest is stopped then)."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), interval)
            return None
        except TimeoutError:
            failure = stack.ended_unexpectedly()
            if failure is not None:
                return failure


def describe(stack: DevStack) -> str:
    """Every address, and the exports that point the CLI (or `conductor worker`) at this stack."""
    env = stack.cli_environment()
    names = "local-1" if stack.instances == 1 else f"local-1..local-{stack.instances}"
    exports = ["TEMPORAL_ADDRESS", "CONDUCTOR_SUBSTRATE_URL", "CONDUCTOR_FLEET_TOKEN_FILE", "CONDUCTOR_EXECUTOR_TOKEN_FILE"]
    if stack.namespace != "default":
        exports.insert(1, "TEMPORAL_NAMESPACE")
    lines = [
        "Mission Conductor dev stack is running",
        f"  Temporal gRPC:    {stack.temporal_address} (namespace {stack.namespace})",
        f"  Temporal Web UI:  {stack.ui_url}",
        f"  Substrate:        {stack.substrate_url} (instances {names})",
        f"  Worker:           task queue {stack.task_queue}",
        f"  Data dir:         {stack.data_dir}",
        "Point another shell's CLI (or `conductor worker`, or `temporal`) at it:",
        f"  eval \"$(conductor dev env{'' if stack.data_dir == DEFAULT_DATA_DIR else ' --data-dir ' + shlex.quote(str(stack.data_dir))})\"",
        "or:",
        *(f"  export {name}={shlex.quote(env[name])}" for name in exports),
        "Press Ctrl-C to stop.",
    ]
    return "\n".join(lines)
